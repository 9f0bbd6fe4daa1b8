// Command render is a small offline stand-in for `helm template`, used by the chart tests
// when Helm's own engine is not installed. It follows Helm's rendering rules for what the
// Conveyor chart uses:
//
//   - values: the chart's values.yaml coalesced with each -f file in order (maps merge
//     recursively, null deletes a key); numbers become float64, as in Helm (YAML -> JSON);
//   - built-in objects: .Values, .Release (Name, Namespace, Service, Revision, IsInstall,
//     IsUpgrade), .Chart (Chart.yaml fields with Helm's capitalised names), .Capabilities
//     (KubeVersion, APIVersions.Has), .Template (Name, BasePath);
//   - functions: sprig's text functions without env/expandenv, plus include, tpl, required,
//     toYaml, fromYaml, toJson, fromJson, lookup (empty, as in `helm template`, unless
//     -lookup names a file of objects standing in for the cluster, as in `helm upgrade`);
//   - every file under templates/ is parsed into one set named "<chart>/templates/...";
//     files starting with "_" are partials; NOTES.txt is rendered only with -notes;
//     "missingkey=zero", and "<no value>" is dropped from the output.
//
// Build (Debian: golang-go, golang-github-masterminds-sprig-dev):
//
//	GO111MODULE=off GOPATH=$PWD/gopath:/usr/share/gocode go build -o render main.go
//
// Usage: render -chart DIR [-f overlay.yaml]... [-name R] [-namespace NS] [-notes]
//
//	[-lookup objects.yaml] [-o FILE]
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"text/template"

	// Debian installs sprig v3 at its GOPATH path without the /v3 suffix.
	sprig "github.com/Masterminds/sprig"
	yaml "gopkg.in/yaml.v2"
)

// chartMetadata mirrors the Chart.yaml fields that Helm exposes as .Chart.
type chartMetadata struct {
	APIVersion   string            `yaml:"apiVersion"`
	Name         string            `yaml:"name"`
	Version      string            `yaml:"version"`
	AppVersion   string            `yaml:"appVersion"`
	Description  string            `yaml:"description"`
	Type         string            `yaml:"type"`
	KubeVersion  string            `yaml:"kubeVersion"`
	Keywords     []string          `yaml:"keywords"`
	Home         string            `yaml:"home"`
	Sources      []string          `yaml:"sources"`
	Icon         string            `yaml:"icon"`
	Deprecated   bool              `yaml:"deprecated"`
	Annotations  map[string]string `yaml:"annotations"`
	Dependencies []interface{}     `yaml:"dependencies"`
}

type apiVersions []string

// Has reports whether the API version (or kind path) is known, like Helm's VersionSet.Has.
func (v apiVersions) Has(name string) bool {
	for _, x := range v {
		if x == name {
			return true
		}
	}
	return false
}

type kubeVersion struct {
	Version, Major, Minor string
}

func (k kubeVersion) String() string { return k.Version }

type capabilities struct {
	KubeVersion kubeVersion
	APIVersions apiVersions
}

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func main() {
	chartDir := flag.String("chart", "", "chart directory")
	name := flag.String("name", "conveyor", "release name")
	namespace := flag.String("namespace", "default", "release namespace")
	notes := flag.Bool("notes", false, "render NOTES.txt only, instead of the manifests")
	out := flag.String("o", "-", "output file (- for stdout)")
	lookupFile := flag.String("lookup", "", "YAML objects that lookup finds (default: none)")
	var overlays stringList
	flag.Var(&overlays, "f", "values file merged over the chart's values.yaml (repeatable)")
	flag.Parse()
	if *chartDir == "" {
		fmt.Fprintln(os.Stderr, "render: -chart is required")
		os.Exit(2)
	}
	cluster, err := readObjects(*lookupFile)
	if err != nil {
		fmt.Fprintf(os.Stderr, "render: %v\n", err)
		os.Exit(1)
	}
	text, err := render(*chartDir, overlays, *name, *namespace, *notes, cluster)
	if err != nil {
		fmt.Fprintf(os.Stderr, "render: %v\n", err)
		os.Exit(1)
	}
	if *out == "-" {
		_, err = os.Stdout.WriteString(text)
	} else {
		err = os.WriteFile(*out, []byte(text), 0o644)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "render: %v\n", err)
		os.Exit(1)
	}
}

func render(chartDir string, overlays []string, name, namespace string, notes bool,
	cluster []map[string]interface{}) (string, error) {
	var meta chartMetadata
	raw, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		return "", err
	}
	if err := yaml.Unmarshal(raw, &meta); err != nil {
		return "", fmt.Errorf("Chart.yaml: %w", err)
	}
	if meta.Name == "" || meta.Version == "" {
		return "", errors.New("Chart.yaml: name and version are required")
	}

	values, err := readValues(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		return "", err
	}
	for _, f := range overlays {
		overlay, err := readValues(f)
		if err != nil {
			return "", err
		}
		values = coalesce(overlay, values)
	}

	tpl := template.New(meta.Name)
	files, err := loadTemplates(chartDir, meta.Name)
	if err != nil {
		return "", err
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)

	tpl.Option("missingkey=zero")
	tpl.Funcs(funcMap(tpl, cluster))
	for _, n := range names {
		if _, err := tpl.New(n).Parse(files[n]); err != nil {
			return "", err
		}
	}

	top := map[string]interface{}{
		"Values": values,
		"Release": map[string]interface{}{
			"Name": name, "Namespace": namespace, "Service": "Helm",
			"Revision": 1, "IsInstall": true, "IsUpgrade": false,
		},
		"Chart": meta,
		"Capabilities": capabilities{
			KubeVersion: kubeVersion{Version: "v1.30.0", Major: "1", Minor: "30"},
			APIVersions: apiVersions{"v1", "apps/v1", "networking.k8s.io/v1", "policy/v1"},
		},
	}

	var outBuf strings.Builder
	for _, n := range names {
		base := path.Base(n)
		isNotes := base == "NOTES.txt"
		if strings.HasPrefix(base, "_") || isNotes != notes {
			continue
		}
		top["Template"] = map[string]interface{}{
			"Name": n, "BasePath": path.Join(meta.Name, "templates"),
		}
		var buf bytes.Buffer
		if err := tpl.ExecuteTemplate(&buf, n, top); err != nil {
			return "", err
		}
		text := strings.ReplaceAll(buf.String(), "<no value>", "")
		if strings.TrimSpace(text) == "" {
			continue
		}
		if notes {
			outBuf.WriteString(text)
			continue
		}
		fmt.Fprintf(&outBuf, "---\n# Source: %s\n%s\n", n, strings.TrimRight(text, "\n"))
	}
	return outBuf.String(), nil
}

// loadTemplates reads every file under <chart>/templates, keyed "<chart>/templates/<rel>".
func loadTemplates(chartDir, chartName string) (map[string]string, error) {
	root := filepath.Join(chartDir, "templates")
	files := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files[path.Join(chartName, "templates", filepath.ToSlash(rel))] = string(data)
		return nil
	})
	return files, err
}

// readValues parses a YAML values file the way Helm does: YAML -> JSON -> Go values.
func readValues(file string) (map[string]interface{}, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var v map[string]interface{}
	if err := yamlToJSONValue(raw, &v); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if v == nil {
		v = map[string]interface{}{}
	}
	return v, nil
}

func yamlToJSONValue(raw []byte, dst interface{}) error {
	var y interface{}
	if err := yaml.Unmarshal(raw, &y); err != nil {
		return err
	}
	j, err := json.Marshal(jsonable(y))
	if err != nil {
		return err
	}
	return json.Unmarshal(j, dst)
}

// jsonable turns yaml.v2's map[interface{}]interface{} into JSON-marshalable maps.
func jsonable(v interface{}) interface{} {
	switch t := v.(type) {
	case map[interface{}]interface{}:
		m := make(map[string]interface{}, len(t))
		for k, val := range t {
			m[fmt.Sprint(k)] = jsonable(val)
		}
		return m
	case []interface{}:
		for i := range t {
			t[i] = jsonable(t[i])
		}
		return t
	default:
		return v
	}
}

// coalesce merges src over dst like Helm's user values over chart defaults: maps merge
// recursively, anything else replaces, and a null in src deletes the key.
func coalesce(src, dst map[string]interface{}) map[string]interface{} {
	out := make(map[string]interface{}, len(dst))
	for k, v := range dst {
		out[k] = v
	}
	for k, v := range src {
		if v == nil {
			delete(out, k)
			continue
		}
		srcMap, srcIsMap := v.(map[string]interface{})
		dstMap, dstIsMap := out[k].(map[string]interface{})
		if srcIsMap && dstIsMap {
			out[k] = coalesce(srcMap, dstMap)
		} else {
			out[k] = v
		}
	}
	return out
}

func toYAML(v interface{}) string {
	// sigs.k8s.io/yaml, as Helm uses it: JSON first (so struct tags and float64 numbers
	// behave as in Helm), then YAML with sorted keys.
	j, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	var y interface{}
	if err := yaml.Unmarshal(j, &y); err != nil {
		return ""
	}
	data, err := yaml.Marshal(y)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(data), "\n")
}

// readObjects parses the Kubernetes objects (YAML documents) that lookup finds.
func readObjects(file string) ([]map[string]interface{}, error) {
	var objs []map[string]interface{}
	if file == "" {
		return objs, nil
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	for {
		var doc interface{}
		if err := dec.Decode(&doc); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		var obj map[string]interface{}
		if j, err := json.Marshal(jsonable(doc)); err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		} else if err := json.Unmarshal(j, &obj); err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if obj != nil {
			objs = append(objs, obj)
		}
	}
	return objs, nil
}

func funcMap(t *template.Template, cluster []map[string]interface{}) template.FuncMap {
	f := sprig.TxtFuncMap()
	delete(f, "env")
	delete(f, "expandenv")

	included := map[string]int{}
	const maxRecursion = 1000
	f["include"] = func(name string, data interface{}) (string, error) {
		if included[name] > maxRecursion {
			return "", fmt.Errorf("rendering template has a nested reference name: %s", name)
		}
		included[name]++
		defer func() { included[name]-- }()
		var buf strings.Builder
		err := t.ExecuteTemplate(&buf, name, data)
		return buf.String(), err
	}
	f["tpl"] = func(text string, data interface{}) (string, error) {
		clone, err := t.Clone()
		if err != nil {
			return "", err
		}
		clone.Option("missingkey=zero")
		parsed, err := clone.New("tpl").Parse(text)
		if err != nil {
			return "", err
		}
		var buf strings.Builder
		if err := parsed.Execute(&buf, data); err != nil {
			return "", err
		}
		return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
	}
	f["required"] = func(msg string, val interface{}) (interface{}, error) {
		if val == nil {
			return val, errors.New(msg)
		}
		if s, ok := val.(string); ok && s == "" {
			return val, errors.New(msg)
		}
		return val, nil
	}
	f["toYaml"] = toYAML
	f["fromYaml"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := yamlToJSONValue([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	f["toJson"] = func(v interface{}) string {
		data, err := json.Marshal(v)
		if err != nil {
			return ""
		}
		return string(data)
	}
	f["fromJson"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	// Like Helm's: one object by name, {"items": [...]} for an empty name, else empty.
	f["lookup"] = func(apiVersion, kind, namespace, name string) (map[string]interface{}, error) {
		var items []interface{}
		for _, obj := range cluster {
			meta, _ := obj["metadata"].(map[string]interface{})
			if obj["apiVersion"] != apiVersion || obj["kind"] != kind ||
				(namespace != "" && meta["namespace"] != namespace) {
				continue
			}
			if name == "" {
				items = append(items, obj)
			} else if meta["name"] == name {
				return obj, nil
			}
		}
		if name == "" && items != nil {
			return map[string]interface{}{"items": items}, nil
		}
		return map[string]interface{}{}, nil
	}
	return f
}
