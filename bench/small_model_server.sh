# Sourced by the bench scripts that serve the `small` bf16 test model on this machine:
# builds the binaries, makes the model if it is missing, and gives free_port and a
# process list that is killed on exit. Expects $repo, $build_dir and $model_dir set.
ninja -C "$build_dir" conveyor-worker conveyor-scheduler conveyor-bench >/dev/null
if [[ ! -f "$model_dir/config.json" ]]; then
  /usr/bin/python3 "$repo/tests/model_gen/make_test_model.py" --preset small --out "$model_dir"
fi

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pids=()  # Started processes; cleanup kills them (at exit, or between runs).
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
