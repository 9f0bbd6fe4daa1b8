#!/usr/bin/env python3
"""The OpenAI-compatible HTTP API as its users see it: the real `openai` package and curl.

Run by tests/http/http_api_test.cc, which starts a real conveyor-scheduler (with
--http_port) and conveyor-worker on the tiny test model and checks the server's side
(metrics) around each run. One test method per invocation:

    openai_client_test.py --base-url http://127.0.0.1:PORT --model NAME TEST_NAME

The last line on stdout is "conveyor-http-test: PASS" or "conveyor-http-test: FAIL"; the
unittest report goes to stderr. Every check is deterministic (greedy or seeded sampling);
waits have limits only so that a hung server fails the test instead of stalling it.
"""

import argparse
import json
import os
import subprocess
import sys
import unittest
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai

ARGS = None

# http_api_test.cc writes the test model's chat template; these messages render as
# RENDERED (bos_token "<s>", eos_token "</s>", from its tokenizer_config.json).
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": [{"type": "text", "text": "Say"}, {"type": "text", "text": "hi"}]},
]
RENDERED = "<s><|system|>You are terse.</s><|user|>Say\nhi</s><|assistant|>"

PROMPT = "Once upon a time"

# The reasoning suite's template (http_api_test.cc's kThinkTemplate) opens <think> at the
# end of the prompt, as DeepSeek-R1's and Qwen3-Thinking's do, so all of the random test
# model's output is reasoning until the server closes it; enable_thinking false closes it in
# the prompt, as Qwen3's template does.
RENDERED_THINKING = RENDERED + "<think>\n"
RENDERED_NOT_THINKING = RENDERED + "<think>\n\n</think>\n\n"


def reasoning_of(message_or_delta):
    """reasoning_content, checked equal to vLLM's newer name for it, `reasoning`."""
    extra = message_or_delta.model_extra or {}
    self_check = extra.get("reasoning_content"), extra.get("reasoning")
    assert self_check[0] == self_check[1], self_check
    return self_check[0]


def post(path, body, raw=False):
    """POSTs `body` (JSON, or bytes when raw); returns (status, parsed JSON body)."""
    data = body if raw else json.dumps(body).encode()
    request = urllib.request.Request(ARGS.base_url + path, data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def get(path):
    try:
        with urllib.request.urlopen(ARGS.base_url + path, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


class OpenAiClientTest(unittest.TestCase):
    maxDiff = None

    @classmethod
    def setUpClass(cls):
        # No retries: a failure must show as it happened.
        cls.client = openai.OpenAI(base_url=ARGS.base_url + "/v1", api_key="unused",
                                   max_retries=0, timeout=300)

    def complete(self, prompt=PROMPT, **kwargs):
        kwargs.setdefault("max_tokens", 12)
        kwargs.setdefault("temperature", 0)
        kwargs.setdefault("extra_body", {"ignore_eos": True})
        return self.client.completions.create(model=ARGS.model, prompt=prompt, **kwargs)

    def stream_completion(self, prompt=PROMPT, **kwargs):
        """Streams a completion; returns (text, chunks)."""
        chunks = list(self.complete(prompt, stream=True, **kwargs))
        return "".join(c.choices[0].text for c in chunks if c.choices), chunks

    def chat(self, **kwargs):
        kwargs.setdefault("max_tokens", 12)
        kwargs.setdefault("temperature", 0)
        kwargs.setdefault("extra_body", {"ignore_eos": True})
        return self.client.chat.completions.create(model=ARGS.model, messages=MESSAGES,
                                                   **kwargs)

    def assertErrorShape(self, body, status):
        self.assertEqual(set(body), {"error"}, body)
        self.assertEqual(set(body["error"]), {"message", "type", "param", "code"}, body)
        self.assertTrue(body["error"]["message"], body)

    # --- Tests ---

    def test_models_and_health(self):
        models = self.client.models.list().data
        self.assertEqual([m.id for m in models], [ARGS.model])
        self.assertEqual(models[0].object, "model")
        self.assertEqual(self.client.models.retrieve(ARGS.model).id, ARGS.model)
        with self.assertRaises(openai.NotFoundError):
            self.client.models.retrieve("no-such-model")
        self.assertEqual(get("/health"), (200, {"status": "serving"}))

    def test_metrics_for_routers(self):
        # The page endpoint pickers scrape on the serving port: queue, running, KV usage as
        # a fraction, and the cache's shape with vLLM's label names.
        self.complete(max_tokens=2)
        with urllib.request.urlopen(ARGS.base_url + "/metrics", timeout=60) as response:
            self.assertEqual(response.status, 200)
            self.assertIn("text/plain", response.headers["Content-Type"])
            page = response.read().decode()
        samples = {}
        for line in page.splitlines():
            if line and not line.startswith("#"):
                series, value = line.rsplit(" ", 1)
                samples[series] = float(value)

        def only(name):
            values = [v for k, v in samples.items() if k.split("{")[0] == name]
            self.assertEqual(len(values), 1, name)
            return values[0]

        self.assertGreaterEqual(only("conveyor_requests_waiting"), 0)
        self.assertGreaterEqual(only("conveyor_requests_running"), 0)
        usage = only("conveyor_kv_cache_usage_ratio")
        self.assertTrue(0 <= usage <= 1, usage)
        self.assertEqual(only("conveyor_cache_config_info"), 1)
        info = next(k for k in samples if k.startswith("conveyor_cache_config_info{"))
        import re
        blocks = int(re.search(r'num_gpu_blocks="(\d+)"', info).group(1))
        self.assertGreater(int(re.search(r'block_size="(\d+)"', info).group(1)), 0)
        self.assertEqual(blocks, only("conveyor_kv_blocks_capacity"))

    def test_router_endpoints(self):
        # What SGLang's router reads when it registers a server, and polls for load.
        status, info = get("/server_info")
        self.assertEqual(status, 200, info)
        self.assertEqual(get("/get_server_info"), (200, info))
        self.assertEqual(info["served_model_name"], ARGS.model)
        self.assertEqual((info["tp_size"], info["dp_size"]), (1, 1))
        self.assertGreater(info["max_total_tokens"], 0)
        self.assertEqual(info["max_total_tokens"] % info["page_size"], 0)
        status, model = get("/model_info")
        self.assertEqual(status, 200, model)
        self.assertEqual(get("/get_model_info"), (200, model))
        self.assertTrue(model["is_generation"])
        self.assertEqual(model["served_model_name"], ARGS.model)
        status, load = get("/get_load")
        self.assertEqual(status, 200, load)
        self.assertEqual(len(load), 1)
        self.assertEqual(load[0]["dp_rank"], 0)
        self.assertGreaterEqual(load[0]["num_reqs"], load[0]["num_waiting_reqs"])
        self.assertGreaterEqual(load[0]["num_tokens"], 0)

        # vLLM's Renderer API (vllm-router's cache-aware policy routes on it): the tokens a
        # request's prompt is computed as. Fed back as a completion's prompt, a chat's
        # rendered tokens give the chat's greedy answer.
        status, rendered = post("/v1/completions/render",
                                {"model": ARGS.model, "prompt": PROMPT, "max_tokens": 5})
        self.assertEqual(status, 200, rendered)
        self.assertEqual(len(rendered), 1)
        self.assertEqual(rendered[0]["model"], ARGS.model)
        self.assertEqual(rendered[0]["sampling_params"]["max_tokens"], 5)
        self.assertEqual(len(rendered[0]["token_ids"]), self.complete().usage.prompt_tokens)
        status, again = post("/v1/completions/render", {"prompt": rendered[0]["token_ids"]})
        self.assertEqual(again[0]["token_ids"], rendered[0]["token_ids"])
        status, chat = post("/v1/chat/completions/render",
                            {"model": ARGS.model, "messages": MESSAGES, "temperature": 0})
        self.assertEqual(status, 200, chat)
        self.assertTrue(chat["request_id"].startswith("chatcmpl-"), chat)
        self.assertEqual(chat["sampling_params"], {"temperature": 0})
        answer = self.chat(max_tokens=8)
        self.assertEqual(len(chat["token_ids"]), answer.usage.prompt_tokens)
        self.assertEqual(self.complete(prompt=chat["token_ids"], max_tokens=8).choices[0].text,
                         answer.choices[0].message.content)
        status, body = post("/v1/chat/completions/render",
                            {"model": "not-" + ARGS.model, "messages": MESSAGES})
        self.assertEqual(status, 404, body)
        self.assertErrorShape(body, 404)

    def test_completion_whole_and_streamed_agree(self):
        whole = self.complete(max_tokens=12)
        choice = whole.choices[0]
        self.assertTrue(whole.id.startswith("cmpl-"), whole.id)
        self.assertEqual(whole.object, "text_completion")
        self.assertEqual(whole.model, ARGS.model)
        self.assertGreater(whole.created, 1600000000)
        self.assertEqual(choice.finish_reason, "length")
        self.assertIsNone(choice.logprobs)
        self.assertTrue(choice.text)
        self.assertEqual(whole.usage.completion_tokens, 12)
        self.assertGreater(whole.usage.prompt_tokens, 1)
        self.assertEqual(whole.usage.total_tokens,
                         whole.usage.prompt_tokens + whole.usage.completion_tokens)

        text, chunks = self.stream_completion(max_tokens=12,
                                              stream_options={"include_usage": True})
        self.assertEqual(text, choice.text)
        self.assertTrue(all(c.object == "text_completion" for c in chunks))
        self.assertEqual(len({c.id for c in chunks}), 1)
        self.assertEqual(chunks[-2].choices[0].finish_reason, "length")
        self.assertTrue(all(c.choices[0].finish_reason is None for c in chunks[:-2]))
        # include_usage: a last chunk with the usage and no choices; the others say null.
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, 12)
        self.assertEqual(chunks[-1].usage.prompt_tokens, whole.usage.prompt_tokens)
        self.assertTrue(all(c.usage is None for c in chunks[:-1]))

        # Without include_usage no chunk has a usage; token-id prompts work too.
        text, chunks = self.stream_completion(prompt=[1, 400, 300, 200], max_tokens=5)
        self.assertTrue(all(c.usage is None for c in chunks))
        self.assertEqual(chunks[-1].choices[0].finish_reason, "length")
        self.assertEqual(self.complete(prompt=[1, 400, 300, 200], max_tokens=5)
                         .choices[0].text, text)

    def test_default_max_tokens_is_openais_16(self):
        response = self.client.completions.create(model=ARGS.model, prompt=PROMPT,
                                                  temperature=0, extra_body={"ignore_eos": True})
        self.assertEqual(response.usage.completion_tokens, 16)

    def test_chat_whole_and_streamed_agree_with_the_rendered_prompt(self):
        whole = self.chat()
        choice = whole.choices[0]
        self.assertTrue(whole.id.startswith("chatcmpl-"), whole.id)
        self.assertEqual(whole.object, "chat.completion")
        self.assertEqual(choice.message.role, "assistant")
        self.assertEqual(choice.finish_reason, "length")
        self.assertEqual(whole.usage.completion_tokens, 12)
        # The chat prompt is exactly the template's text, with no BOS added to it.
        reference = self.complete(prompt=RENDERED,
                                  extra_body={"ignore_eos": True, "add_special_tokens": False})
        self.assertEqual(choice.message.content, reference.choices[0].text)
        self.assertEqual(whole.usage.prompt_tokens, reference.usage.prompt_tokens)

        chunks = list(self.chat(stream=True, stream_options={"include_usage": True}))
        self.assertTrue(all(c.object == "chat.completion.chunk" for c in chunks))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(content, choice.message.content)
        self.assertEqual(chunks[-2].choices[0].finish_reason, "length")
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, 12)

        # max_completion_tokens is the newer name of max_tokens.
        short = self.client.chat.completions.create(
            model=ARGS.model, messages=MESSAGES, temperature=0, max_completion_tokens=3,
            extra_body={"ignore_eos": True})
        self.assertEqual(short.usage.completion_tokens, 3)

    def test_stop_strings(self):
        base = self.complete(max_tokens=24).choices[0].text
        # A printable stop string whose first occurrence is a few characters in.
        start = next(i for i in range(3, len(base) - 3)
                     if base.find(base[i:i + 3]) == i
                     and all(32 < ord(c) < 127 for c in base[i:i + 3]))
        stop = base[start:start + 3]
        for stop_arg in (stop, [stop, "\u2603never"]):
            stopped = self.complete(max_tokens=24, stop=stop_arg)
            self.assertEqual(stopped.choices[0].text, base[:start], stop_arg)
            self.assertEqual(stopped.choices[0].finish_reason, "stop")
            # vLLM's stop_reason: which stop string ended it.
            self.assertEqual(stopped.choices[0].model_extra["stop_reason"], stop)
            self.assertLess(stopped.usage.completion_tokens, 24)
        self.assertIsNone(self.complete(max_tokens=4).choices[0].model_extra["stop_reason"])
        text, chunks = self.stream_completion(max_tokens=24, stop=stop)
        self.assertEqual(text, base[:start])
        self.assertEqual(chunks[-1].choices[0].finish_reason, "stop")
        self.assertEqual(chunks[-1].choices[0].model_extra["stop_reason"], stop)
        # Anthropic's stop_sequences: stop_reason "stop_sequence" names the one that ended it.
        client = self.anthropic_client()
        kwargs = dict(model=ARGS.model, max_tokens=24,
                      messages=[{"role": "user", "content": "hi"}],
                      extra_body={"temperature": 0, "ignore_eos": True})
        full = client.messages.create(**kwargs)
        self.assertIsNone(full.stop_sequence)
        answer = full.content[0].text
        start = next(i for i in range(3, len(answer) - 3)
                     if answer.find(answer[i:i + 3]) == i
                     and all(32 < ord(c) < 127 for c in answer[i:i + 3]))
        cut = client.messages.create(stop_sequences=["\u2603never", answer[start:start + 3]],
                                     **kwargs)
        self.assertEqual(cut.stop_reason, "stop_sequence")
        self.assertEqual(cut.stop_sequence, answer[start:start + 3])
        self.assertEqual(cut.content[0].text, answer[:start])

    def test_logprobs(self):
        whole = self.complete(max_tokens=6, logprobs=3)
        lp = whole.choices[0].logprobs
        self.assertEqual(len(lp.tokens), 6)
        self.assertEqual(len(lp.token_logprobs), 6)
        self.assertEqual(len(lp.text_offset), 6)
        self.assertEqual(len(lp.top_logprobs), 6)
        for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
            self.assertLessEqual(chosen, 0)
            self.assertTrue(1 <= len(top) <= 3, top)
            # Greedy: the chosen token is the most likely one.
            self.assertAlmostEqual(chosen, max(top.values()), places=4)
        _, chunks = self.stream_completion(max_tokens=6, logprobs=0)
        streamed = [t for c in chunks for t in c.choices[0].logprobs.token_logprobs]
        self.assertEqual(len(streamed), 6)
        for a, b in zip(streamed, lp.token_logprobs):
            self.assertAlmostEqual(a, b, places=4)

        chat = self.chat(max_tokens=5, logprobs=True, top_logprobs=2)
        content = chat.choices[0].logprobs.content
        self.assertEqual(len(content), 5)
        for entry in content:
            self.assertEqual(len(entry.top_logprobs), 2)
            self.assertEqual(entry.bytes, list(entry.token.encode()))
            self.assertAlmostEqual(entry.logprob, entry.top_logprobs[0].logprob, places=4)
        chunks = list(self.chat(max_tokens=5, logprobs=True, stream=True))
        streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
                    for e in c.choices[0].logprobs.content]
        self.assertEqual([e.token for e in streamed], [e.token for e in content])
        self.assertTrue(all(e.top_logprobs == [] for e in streamed))
        self.assertIsNone(self.chat(max_tokens=2).choices[0].logprobs)

    def test_logit_bias(self):
        # +100 forces a token at every position; -100 bans it (another forced one wins).
        forced = self.complete(max_tokens=6, logprobs=1, logit_bias={"300": 100})
        tokens = forced.choices[0].logprobs.tokens
        self.assertEqual(len(tokens), 6)
        self.assertEqual(len(set(tokens)), 1, tokens)
        other = self.complete(max_tokens=6, logprobs=1, logit_bias={"300": -100, "301": 100})
        others = other.choices[0].logprobs.tokens
        self.assertEqual(len(set(others)), 1, others)
        self.assertNotEqual(others[0], tokens[0])
        # Sampled too, and through the chat endpoint.
        chat = self.chat(max_tokens=4, temperature=1.0, seed=7, logprobs=True,
                         logit_bias={"300": 100})
        self.assertEqual([e.token for e in chat.choices[0].logprobs.content], [tokens[0]] * 4)
        with self.assertRaises(openai.BadRequestError) as bad:
            self.complete(logit_bias={"300": 101})
        self.assertIn("logit_bias", str(bad.exception))

    def test_n_choices(self):
        sampled = dict(temperature=1.0, seed=41, max_tokens=10)
        whole = self.complete(n=4, **sampled)
        self.assertEqual([c.index for c in whole.choices], [0, 1, 2, 3])
        texts = [c.text for c in whole.choices]
        self.assertGreater(len(set(texts)), 1, texts)  # Each choice samples on its own.
        self.assertEqual(whole.usage.completion_tokens, 40)
        self.assertEqual(whole.usage.prompt_tokens, self.complete(max_tokens=1).usage.prompt_tokens)
        # Reproducible, and choice i is what one choice with seed + i gives.
        self.assertEqual([c.text for c in self.complete(n=4, **sampled).choices], texts)
        for i in (0, 1, 3):
            single = dict(sampled, seed=41 + i)
            self.assertEqual(self.complete(**single).choices[0].text, texts[i])
        # Streamed: every chunk names its choice; each choice's text and reason as whole.
        chunks = list(self.complete(n=4, stream=True, stream_options={"include_usage": True},
                                    **sampled))
        streamed, reasons = ["" for _ in texts], [None for _ in texts]
        for chunk in chunks:
            for c in chunk.choices:
                streamed[c.index] += c.text
                if c.finish_reason is not None:
                    self.assertIsNone(reasons[c.index])
                    reasons[c.index] = c.finish_reason
        self.assertEqual(streamed, texts)
        self.assertEqual(reasons, ["length"] * 4)
        self.assertEqual(chunks[-1].usage.completion_tokens, 40)
        self.assertEqual([c for c in chunks if c.usage is not None], [chunks[-1]])
        # One choice's stop string ends that choice alone.
        stop = next(texts[0][i:i + 3] for i in range(len(texts[0]) - 2)
                    if texts[0][i:i + 3].strip() and texts[0][i:i + 3] not in texts[1])
        stopped = self.complete(n=2, stop=[stop], **sampled).choices
        self.assertEqual(stopped[0].finish_reason, "stop")
        self.assertEqual(stopped[0].text, texts[0][:texts[0].index(stop)])
        self.assertEqual((stopped[1].finish_reason, stopped[1].text), ("length", texts[1]))
        # Chat, whole and streamed.
        chat = self.chat(n=3, **sampled)
        self.assertEqual([c.index for c in chat.choices], [0, 1, 2])
        contents = [c.message.content for c in chat.choices]
        self.assertEqual(chat.usage.completion_tokens, 30)
        streamed = ["", "", ""]
        roles = set()
        for chunk in self.chat(n=3, stream=True, **sampled):
            for c in chunk.choices:
                streamed[c.index] += c.delta.content or ""
                if c.delta.role:
                    roles.add(c.index)
        self.assertEqual(streamed, contents)
        self.assertEqual(roles, {0, 1, 2})

    def test_seed_makes_sampling_reproducible(self):
        sampled = dict(temperature=1.0, top_p=0.95, seed=1234, max_tokens=16)
        first = self.complete(**sampled).choices[0].text
        self.assertEqual(self.complete(**sampled).choices[0].text, first)
        self.assertEqual(self.stream_completion(**sampled)[0], first)
        chat = self.chat(**sampled).choices[0].message.content
        self.assertEqual(self.chat(**sampled).choices[0].message.content, chat)

    def test_bad_requests(self):
        cases = [
            (dict(n=129), "n must be in [1, 128]"),
            (dict(n=0), "n must be in [1, 128]"),
            (dict(temperature=-1), "temperature must be in"),
            (dict(extra_body={"temperature": "hot"}), "temperature must be a number"),
            (dict(prompt=["one", "two"]), "only one prompt"),
            (dict(best_of=2), "best_of must equal n"),
            (dict(max_tokens=100000), "exceeds the model's context"),
            (dict(prompt=[1, 10 ** 6]), "outside the vocabulary"),
        ]
        for kwargs, message in cases:
            with self.subTest(kwargs=kwargs):
                with self.assertRaises(openai.BadRequestError) as raised:
                    self.complete(**kwargs)
                self.assertEqual(raised.exception.status_code, 400)
                self.assertIn(message, raised.exception.body["message"])
                self.assertEqual(raised.exception.body["type"], "invalid_request_error")
        with self.assertRaises(openai.BadRequestError) as raised:
            self.chat(n=129)
        self.assertEqual(raised.exception.body["param"], "n")
        with self.assertRaises(openai.BadRequestError):
            self.client.chat.completions.create(
                model=ARGS.model, messages=[{"role": "wizard", "content": "x"}])

        with self.assertRaises(openai.NotFoundError) as raised:
            self.client.completions.create(model="gpt-4", prompt="x")
        self.assertEqual(raised.exception.status_code, 404)
        self.assertEqual(raised.exception.body["code"], "model_not_found")

        status, body = post("/v1/completions", b"{not json", raw=True)
        self.assertEqual(status, 400)
        self.assertErrorShape(body, 400)
        status, body = post("/v1/nothing", {})
        self.assertEqual(status, 404)
        self.assertErrorShape(body, 404)
        self.assertEqual(body["error"]["code"], "unknown_url")

    def test_disconnect_mid_stream(self):
        # Far more tokens than the few read before the client goes; http_api_test.cc
        # checks that the engine cancelled the request and freed its KV blocks.
        stream = self.complete(max_tokens=1500, stream=True)
        for i, _ in enumerate(stream):
            if i == 2:
                break
        stream.close()

    def test_error_mid_stream(self):
        stream = self.complete(max_tokens=1900, stream=True)
        chunks = iter(stream)
        next(chunks)
        next(chunks)
        # http_api_test.cc kills the worker when it reads this line.
        print("conveyor-http-test-streaming", flush=True)
        with self.assertRaises(openai.APIError) as raised:
            for _ in chunks:
                pass
        self.assertIn("worker", raised.exception.message)
        self.assertEqual(raised.exception.body["type"], "server_error")

    def test_curl_streams_server_sent_events(self):
        body = {"model": ARGS.model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                "ignore_eos": True, "stream": True}
        out = subprocess.run(
            ["curl", "-sS", "-N", "-i", "-H", "Content-Type: application/json",
             "-d", json.dumps(body), ARGS.base_url + "/v1/completions"],
            capture_output=True, timeout=300, check=True).stdout.decode()
        head, _, events = out.partition("\r\n\r\n")
        self.assertIn("200", head.splitlines()[0])
        self.assertIn("content-type: text/event-stream", head.lower())
        lines = [line for line in events.split("\n") if line]
        self.assertTrue(all(line.startswith("data: ") for line in lines), lines)
        self.assertEqual(lines[-1], "data: [DONE]")
        chunks = [json.loads(line[len("data: "):]) for line in lines[:-1]]
        text = "".join(c["choices"][0]["text"] for c in chunks)
        self.assertEqual(text, self.complete(max_tokens=8).choices[0].text)
        self.assertEqual(chunks[-1]["choices"][0]["finish_reason"], "length")

        # A plain error answer through curl.
        out = subprocess.run(
            ["curl", "-sS", "-w", "\n%{http_code}", "-H", "Content-Type: application/json",
             "-d", json.dumps({"prompt": "x", "n": 300}), ARGS.base_url + "/v1/completions"],
            capture_output=True, timeout=300, check=True).stdout.decode()
        error, _, code = out.rpartition("\n")
        self.assertEqual(code, "400")
        self.assertErrorShape(json.loads(error), 400)

    def test_64_concurrent_streams(self):
        prompts = ["Once upon a time", "The river", "In the beginning", "A small bird"]
        alone = {p: self.complete(prompt=p, max_tokens=10).choices[0].text for p in prompts}

        def run(i):
            prompt = prompts[i % len(prompts)]
            chunks = list(self.complete(prompt=prompt, max_tokens=10, stream=True,
                                        stream_options={"include_usage": True}))
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            return prompt, text, chunks[-1].usage.completion_tokens

        with ThreadPoolExecutor(max_workers=64) as pool:
            results = list(pool.map(run, range(64)))
        for prompt, text, tokens in results:
            self.assertEqual(text, alone[prompt])
            self.assertEqual(tokens, 10)

    # --- Structured output (docs/structured-output.md) ---

    def structured(self, schema, seed, stream=False, max_tokens=200):
        """A chat completion constrained to `schema`, sampled; (text, finish_reason)."""
        kwargs = dict(model=ARGS.model, messages=MESSAGES, max_tokens=max_tokens,
                      temperature=1.0, seed=seed,
                      response_format={"type": "json_schema",
                                       "json_schema": {"name": "t", "strict": True,
                                                       "schema": schema}})
        if not stream:
            choice = self.client.chat.completions.create(**kwargs).choices[0]
            return choice.message.content, choice.finish_reason
        text, reason = "", None
        for chunk in self.client.chat.completions.create(stream=True, **kwargs):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                reason = chunk.choices[0].finish_reason or reason
        return text, reason

    def test_structured_output_validates(self):
        """Every constrained generation that ends validates with `jsonschema`; most end."""
        import random
        import jsonschema
        count = int(os.environ.get("CONVEYOR_STRUCTURED_GENERATIONS", "2000"))
        schemas = [random_schema(random.Random(i)) for i in range(count)]

        def run(i):
            return self.structured(schemas[i], seed=i, stream=i % 4 == 0)

        with ThreadPoolExecutor(max_workers=32) as pool:
            results = list(pool.map(run, range(count)))
        ended = 0
        for i, (text, reason) in enumerate(results):
            self.assertIn(reason, ("stop", "length"), text)
            if reason != "stop":
                continue
            ended += 1
            try:
                value = json.loads(text)
            except json.JSONDecodeError as e:
                self.fail(f"schema {json.dumps(schemas[i])}: {text!r} is not JSON: {e}")
            jsonschema.validate(value, schemas[i],
                                format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        print(f"structured: {ended} of {count} generations ended; all validate",
              file=sys.stderr)
        self.assertGreaterEqual(ended, count * 0.8)

    def test_structured_output_streams_as_it_answers_whole(self):
        schema = random_schema(__import__("random").Random(99))
        for seed in range(4):
            self.assertEqual(self.structured(schema, seed), self.structured(schema, seed, True))

    def test_json_object(self):
        for seed in range(8):
            choice = self.client.chat.completions.create(
                model=ARGS.model, messages=MESSAGES, max_tokens=300, temperature=0.7, seed=seed,
                response_format={"type": "json_object"}).choices[0]
            if choice.finish_reason == "stop":
                self.assertIsInstance(json.loads(choice.message.content), dict)
            else:
                self.assertTrue(choice.message.content.startswith("{"), choice.message.content)

    def test_parse_helper_round_trips_a_pydantic_model(self):
        """openai's `parse` sends the model's strict schema and parses the answer back."""
        from typing import List, Literal, Optional
        import pydantic

        class Item(pydantic.BaseModel):
            name: str = pydantic.Field(max_length=6)
            count: int

        class Order(pydantic.BaseModel):
            kind: Literal["pickup", "delivery"]
            items: List[Item] = pydantic.Field(max_length=3)
            note: Optional[str] = pydantic.Field(max_length=5)
            paid: bool

        parsed = 0
        for seed in range(6):
            completion = self.client.beta.chat.completions.parse(
                model=ARGS.model, messages=MESSAGES, max_tokens=300, temperature=0.8,
                seed=seed, response_format=Order)
            message = completion.choices[0].message
            self.assertEqual(completion.choices[0].finish_reason, "stop", message.content)
            self.assertIsInstance(message.parsed, Order)
            self.assertEqual(message.parsed, Order.model_validate_json(message.content))
            parsed += 1
        self.assertEqual(parsed, 6)

    def test_bad_schemas_are_400s_that_name_the_keyword(self):
        for schema, words in [
                ({"type": "object", "properties": {"a": {"type": "string", "foo": 1}}},
                 ["foo", "properties"]),
                ({"type": "objekt"}, ["objekt"]),
                ({"$ref": "#/$defs/missing"}, ["missing"])]:
            with self.assertRaises(openai.BadRequestError) as raised:
                self.structured(schema, seed=0)
            message = raised.exception.body["message"]
            for word in words:
                self.assertIn(word, message)
            self.assertEqual(raised.exception.body["param"], "response_format")

    # --- The Responses API and the Messages API (the chat request they mean) ---

    INPUT_ITEMS = [
        {"role": "developer", "content": "You are terse."},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "Say"}, {"type": "input_text", "text": "hi"}]},
    ]

    def test_responses_api(self):
        chat = self.chat(max_tokens=12)
        want = chat.choices[0].message.content
        kwargs = dict(model=ARGS.model, max_output_tokens=12, temperature=0,
                      extra_body={"ignore_eos": True})
        whole = self.client.responses.create(input=self.INPUT_ITEMS, **kwargs)
        self.assertEqual(whole.object, "response")
        self.assertEqual(whole.output_text, want)
        self.assertEqual(whole.status, "incomplete")
        self.assertEqual(whole.incomplete_details.reason, "max_output_tokens")
        self.assertEqual([item.type for item in whole.output], ["message"])
        self.assertEqual(whole.usage.input_tokens, chat.usage.prompt_tokens)
        self.assertEqual(whole.usage.output_tokens, 12)
        self.assertEqual(whole.max_output_tokens, 12)
        self.assertFalse(whole.store)
        # instructions and a string input mean the same conversation.
        same = self.client.responses.create(input="Say\nhi", instructions="You are terse.",
                                            **kwargs)
        self.assertEqual(same.output_text, want)
        self.assertEqual(same.instructions, "You are terse.")
        # Streamed: numbered events, deltas adding up to the whole, the final object.
        events = list(self.client.responses.create(input=self.INPUT_ITEMS, stream=True, **kwargs))
        types = [e.type for e in events]
        self.assertEqual(types[:4], ["response.created", "response.in_progress",
                                     "response.output_item.added", "response.content_part.added"])
        self.assertEqual(types[-4:], ["response.output_text.done", "response.content_part.done",
                                      "response.output_item.done", "response.incomplete"])
        self.assertEqual([e.sequence_number for e in events], list(range(len(events))))
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        self.assertEqual(deltas, want)
        self.assertEqual(events[-1].response.output_text, want)
        # text.format: a JSON schema the output follows.
        schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 5}},
                  "required": ["a"], "additionalProperties": False}
        structured = self.client.responses.create(
            model=ARGS.model, input="JSON please", max_output_tokens=100, temperature=1.0,
            text={"format": {"type": "json_schema", "name": "a", "schema": schema, "strict": True}})
        import jsonschema
        jsonschema.validate(json.loads(structured.output_text), schema)
        self.assertEqual(structured.status, "completed")
        # What needs stored state, or a hosted tool, is a 400 naming the field.
        for extra, param, words in [
                (dict(previous_response_id="resp_1"), "previous_response_id", "store"),
                (dict(max_output_tokens=0), "max_output_tokens", "max_output_tokens"),
                (dict(tools=[{"type": "web_search"}]), "tools[0].type", "function tools"),
                (dict(input=[{"role": "user", "content": [{"type": "input_image"}]}]),
                 "input[0].content[0].type", "text")]:
            with self.subTest(param=param):
                args = dict(dict(model=ARGS.model, input="hi"), **extra)
                with self.assertRaises(openai.BadRequestError) as raised:
                    self.client.responses.create(**args)
                self.assertEqual(raised.exception.body["param"], param)
                self.assertIn(words, raised.exception.body["message"])

    def anthropic_client(self):
        import anthropic
        return anthropic.Anthropic(base_url=ARGS.base_url, api_key="unused", max_retries=0,
                                   timeout=300)

    def test_messages_api(self):
        want = self.chat(max_tokens=12).choices[0].message.content
        client = self.anthropic_client()
        # Sampling fields beyond Anthropic's (ignore_eos) go in the body; this client version
        # types none of them.
        kwargs = dict(model=ARGS.model, max_tokens=12, system="You are terse.",
                      messages=[{"role": "user", "content": [{"type": "text", "text": "Say"},
                                                             {"type": "text", "text": "hi"}]}],
                      extra_body={"temperature": 0, "ignore_eos": True})
        whole = client.messages.create(**kwargs)
        self.assertEqual(whole.type, "message")
        self.assertEqual([b.type for b in whole.content], ["text"])
        self.assertEqual(whole.content[0].text, want)
        self.assertEqual(whole.stop_reason, "max_tokens")
        self.assertEqual(whole.usage.output_tokens, 12)
        with client.messages.stream(**kwargs) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        self.assertEqual(text, want)
        self.assertEqual(final.content[0].text, want)
        self.assertEqual(final.stop_reason, "max_tokens")
        self.assertEqual(final.usage.input_tokens, whole.usage.input_tokens)
        # Errors come in Anthropic's shape.
        status, body = post("/v1/messages", {"model": ARGS.model, "messages": []})
        self.assertEqual(status, 400)
        self.assertEqual(body["type"], "error")
        self.assertEqual(body["error"]["type"], "invalid_request_error")
        self.assertIn("max_tokens", body["error"]["message"])

    def test_responses_and_messages_tools(self):
        flat = [dict(type="function", **t["function"]) for t in TOOLS]
        for seed in range(6):
            _, chat_calls, _ = self.tool_chat(seed, tool_choice="required")
            whole = self.client.responses.create(
                model=ARGS.model, input="Weather?", tools=flat, tool_choice="required",
                max_output_tokens=300, temperature=1.0, extra_body={"seed": seed})
            calls = [(i.name, i.arguments) for i in whole.output if i.type == "function_call"]
            self.assertEqual(calls, chat_calls)
            for item in whole.output:
                if item.type == "function_call":
                    self.assertTrue(item.call_id)
            events = list(self.client.responses.create(
                model=ARGS.model, input="Weather?", tools=flat, tool_choice="required",
                max_output_tokens=300, temperature=1.0, extra_body={"seed": seed}, stream=True))
            streamed = [(e.name, e.arguments) for e in events
                        if e.type == "response.function_call_arguments.done"]
            self.assertEqual(streamed, chat_calls)
            anthropic_tools = [{"name": t["function"]["name"],
                                "description": t["function"]["description"],
                                "input_schema": t["function"]["parameters"]} for t in TOOLS]
            message = self.anthropic_client().messages.create(
                model=ARGS.model, max_tokens=300, tools=anthropic_tools,
                tool_choice={"type": "any"}, messages=[{"role": "user", "content": "Weather?"}],
                extra_body={"temperature": 1.0, "seed": seed})
            uses = [(b.name, b.input) for b in message.content if b.type == "tool_use"]
            self.assertEqual(uses, [(n, json.loads(a)) for n, a in chat_calls])
            if message.stop_reason != "max_tokens":
                self.assertEqual(message.stop_reason, "tool_use")
        # A call and its output sent back, in each API's items.
        answer = self.client.responses.create(
            model=ARGS.model, tools=flat, max_output_tokens=5, temperature=0,
            input=[{"role": "user", "content": "Weather in Oslo?"},
                   {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                    "arguments": '{"city": "Oslo"}'},
                   {"type": "function_call_output", "call_id": "call_1", "output": "-3 C"}])
        self.assertIn(answer.status, ("completed", "incomplete"))
        reply = self.anthropic_client().messages.create(
            model=ARGS.model, max_tokens=5, tools=anthropic_tools, extra_body={"temperature": 0},
            messages=[{"role": "user", "content": "Weather in Oslo?"},
                      {"role": "assistant", "content": [
                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                           "input": {"city": "Oslo"}}]},
                      {"role": "user", "content": [
                          {"type": "tool_result", "tool_use_id": "toolu_1", "content": "-3 C"}]}])
        self.assertEqual(reply.type, "message")

    def test_echo_and_prompt_logprobs(self):
        # Echo: the prompt's text comes first; with logprobs, every prompt token's score
        # (the first has none) -- what evaluation harnesses compute loglikelihoods from.
        plain = self.complete(max_tokens=4)
        echoed = self.complete(max_tokens=4, echo=True)
        self.assertEqual(echoed.choices[0].text, PROMPT + plain.choices[0].text)
        scored = self.complete(max_tokens=1, echo=True, logprobs=2)
        lp = scored.choices[0].logprobs
        prompt_tokens = scored.usage.prompt_tokens
        self.assertEqual(len(lp.tokens), prompt_tokens + 1)
        self.assertIsNone(lp.token_logprobs[0])
        self.assertIsNone(lp.top_logprobs[0])
        self.assertTrue(all(v <= 0 for v in lp.token_logprobs[1:]))
        self.assertTrue(all(len(t) <= 2 for t in lp.top_logprobs[1:]))
        # Each prompt token's score is what the prompt before it gives that token.
        for i in range(1, prompt_tokens):
            self.assertLessEqual(lp.token_logprobs[i], max(lp.top_logprobs[i].values()) + 1e-6)
        streamed, chunks = self.stream_completion(max_tokens=4, echo=True)
        self.assertEqual(streamed, echoed.choices[0].text)
        self.assertTrue(chunks[0].choices[0].text.startswith(PROMPT))

    # --- Tool calling ---

    def test_tools_need_a_template_that_renders_them(self):
        with self.assertRaises(openai.BadRequestError) as raised:
            self.chat(tools=TOOLS)
        self.assertEqual(raised.exception.body["param"], "tools")
        self.assertIn("does not render tools", raised.exception.body["message"])
        # tool_choice "none" hides them: nothing to drop.
        self.chat(tools=TOOLS, tool_choice="none")

    def tool_chat(self, seed, stream=False, **kwargs):
        """A chat with TOOLS, sampled; (content, calls as (name, arguments), finish)."""
        kwargs = dict(dict(model=ARGS.model, messages=[{"role": "user", "content": "Weather?"}],
                           max_tokens=300, temperature=1.0, seed=seed, tools=TOOLS), **kwargs)
        if not stream:
            choice = self.client.chat.completions.create(**kwargs).choices[0]
            calls = choice.message.tool_calls or []
            for call in calls:
                self.assertEqual(call.type, "function")
                self.assertRegex(call.id, r"^call_[A-Za-z0-9]{24}$")
            return (choice.message.content,
                    [(c.function.name, c.function.arguments) for c in calls],
                    choice.finish_reason)
        content, calls, finish = "", {}, None
        for chunk in self.client.chat.completions.create(stream=True, **kwargs):
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, ["", ""])
                if call.id:
                    self.assertRegex(call.id, r"^call_[A-Za-z0-9]{24}$")
                if call.function.name:
                    entry[0] += call.function.name
                entry[1] += call.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        ordered = [tuple(calls[i]) for i in sorted(calls)]
        return (content if content or not ordered else None), ordered, finish

    def check_calls(self, calls, names=None):
        import jsonschema
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
        self.assertTrue(calls)
        for name, arguments in calls:
            self.assertIn(name, names or schemas)
            jsonschema.validate(json.loads(arguments), schemas[name])

    def test_tools_required(self):
        for seed in range(24):
            parallel = seed % 2 == 0
            content, calls, finish = self.tool_chat(seed, tool_choice="required",
                                                    parallel_tool_calls=parallel)
            self.check_calls(calls)
            if parallel and finish == "length":
                continue  # More calls were coming: the last one, cut, is content.
            self.assertEqual(finish, "tool_calls", (content, calls))
            self.assertIsNone(content)
            if not parallel:
                self.assertEqual(len(calls), 1)

    def test_tools_named(self):
        for seed in range(12):
            content, calls, finish = self.tool_chat(
                seed, tool_choice={"type": "function", "function": {"name": "get_time"}},
                parallel_tool_calls=False)
            self.assertEqual(finish, "tool_calls")
            self.assertEqual(len(calls), 1)
            self.check_calls(calls, names=["get_time"])

    def test_tools_streamed_equal_whole(self):
        for seed in range(8):
            whole = self.tool_chat(seed, tool_choice="required")
            self.assertEqual(self.tool_chat(seed, stream=True, tool_choice="required"), whole)
            whole = self.tool_chat(seed)
            self.assertEqual(self.tool_chat(seed, stream=True), whole)

    def test_tools_auto_and_tool_messages(self):
        for seed in range(6):
            content, calls, finish = self.tool_chat(seed, max_tokens=20)
            self.assertIn(finish, ("stop", "length", "tool_calls"))
            if finish == "tool_calls":
                self.check_calls(calls)
            else:
                self.assertIsInstance(content, str)
        # A call and its result, sent back as clients do (arguments as JSON text).
        messages = [{"role": "user", "content": "Weather in Oslo?"},
                    {"role": "assistant", "content": None, "tool_calls": [
                        {"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "-3 C"}]
        choice = self.client.chat.completions.create(
            model=ARGS.model, messages=messages, tools=TOOLS, max_tokens=5,
            temperature=0).choices[0]
        self.assertIn(choice.finish_reason, ("stop", "length", "tool_calls"))

    # --- Reasoning (the kThinkTemplate suite) ---

    def reference(self, prompt, max_tokens):
        return self.complete(prompt=prompt, max_tokens=max_tokens,
                             extra_body={"ignore_eos": True, "add_special_tokens": False})

    def stream_chat_parts(self, **kwargs):
        """Streams a chat; returns (reasoning, content, chunks)."""
        chunks = list(self.chat(stream=True, stream_options={"include_usage": True}, **kwargs))
        reasoning = "".join(reasoning_of(c.choices[0].delta) or "" for c in chunks if c.choices)
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return reasoning, content, chunks

    def test_reasoning_whole_and_streamed(self):
        whole = self.chat(max_tokens=12)
        message = whole.choices[0].message
        # The prompt ends inside <think>: everything is reasoning, there is no answer.
        expected = self.reference(RENDERED_THINKING, 12).choices[0].text
        self.assertEqual(reasoning_of(message), expected)
        self.assertEqual(message.content, "")
        self.assertEqual(whole.choices[0].finish_reason, "length")
        self.assertEqual(whole.usage.completion_tokens, 12)
        reasoning, content, chunks = self.stream_chat_parts(max_tokens=12)
        self.assertEqual(reasoning, expected)
        self.assertEqual(content, "")
        self.assertEqual(chunks[-1].usage.completion_tokens, 12)
        for chunk in chunks:
            if chunk.choices and reasoning_of(chunk.choices[0].delta):
                self.assertIsNone(chunk.choices[0].delta.content)

    def test_chat_template_kwargs_turn_thinking_off(self):
        whole = self.chat(max_tokens=12, extra_body={"ignore_eos": True,
                                                     "chat_template_kwargs":
                                                     {"enable_thinking": False}})
        message = whole.choices[0].message
        expected = self.reference(RENDERED_NOT_THINKING, 12)
        self.assertIsNone(reasoning_of(message))
        self.assertEqual(message.content, expected.choices[0].text)
        self.assertEqual(whole.usage.prompt_tokens, expected.usage.prompt_tokens)
        self.assertGreater(whole.usage.prompt_tokens,
                           self.reference(RENDERED_THINKING, 1).usage.prompt_tokens)
        status, body = post("/v1/chat/completions", {"messages": MESSAGES,
                                                     "chat_template_kwargs": ["enable_thinking"]})
        self.assertEqual(status, 400)
        self.assertErrorShape(body, 400)
        self.assertEqual(body["error"]["param"], "chat_template_kwargs")

    def test_reasoning_budget_closes_the_thinking(self):
        extra = {"ignore_eos": True, "max_reasoning_tokens": 5}
        whole = self.chat(max_tokens=40, extra_body=extra)
        message = whole.choices[0].message
        # Five tokens of reasoning, then the server's "\n</think>\n\n", then the answer.
        self.assertEqual(reasoning_of(message),
                         self.reference(RENDERED_THINKING, 5).choices[0].text + "\n")
        # (The test tokenizer spells the end text in several tokens.)
        self.assertTrue(message.content, whole)
        self.assertNotIn("think>", message.content)
        self.assertEqual(whole.choices[0].finish_reason, "length")
        self.assertEqual(whole.usage.completion_tokens, 40)
        self.assertEqual(whole.usage.prompt_tokens,
                         self.reference(RENDERED_THINKING, 1).usage.prompt_tokens)
        # The same answer streamed, as one stream.
        reasoning, content, chunks = self.stream_chat_parts(max_tokens=40, extra_body=extra)
        self.assertEqual((reasoning, content), (reasoning_of(message), message.content))
        self.assertEqual(len({c.id for c in chunks}), 1)
        self.assertEqual([c.choices[0].finish_reason for c in chunks if c.choices
                          and c.choices[0].finish_reason], ["length"])
        self.assertEqual(chunks[-1].usage.completion_tokens, 40)
        # A budget at or over max_tokens changes nothing.
        self.assertEqual(self.chat(max_tokens=6, extra_body={"ignore_eos": True,
                                                             "max_reasoning_tokens": 6})
                         .choices[0].message.model_extra,
                         self.chat(max_tokens=6).choices[0].message.model_extra)

    def test_reasoning_and_constraints(self):
        # A constraint covers the whole output: it is the answer, with no reasoning split.
        whole = self.chat(max_tokens=60, response_format={"type": "json_object"}, seed=3,
                          extra_body={},
                          temperature=1.0)
        message = whole.choices[0].message
        self.assertIsNone(reasoning_of(message))
        if whole.choices[0].finish_reason == "stop":
            json.loads(message.content)
        status, body = post("/v1/chat/completions", {
            "messages": MESSAGES, "max_reasoning_tokens": 4,
            "response_format": {"type": "json_object"}})
        self.assertEqual(status, 400)
        self.assertEqual(body["error"]["param"], "max_reasoning_tokens")

    def test_no_reasoning_parser_refuses_a_budget(self):
        status, body = post("/v1/chat/completions", {"messages": MESSAGES,
                                                     "max_reasoning_tokens": 4})
        self.assertEqual(status, 400)
        self.assertEqual(body["error"]["param"], "max_reasoning_tokens")
        self.assertIn("--reasoning_parser", body["error"]["message"])
        self.assertNotIn("reasoning_content", self.chat(max_tokens=2).choices[0].message.model_extra)


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 8},
            "unit": {"enum": ["C", "F"]}}, "required": ["city"],
            "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The time in a zone.",
        "parameters": {"type": "object", "properties": {
            "zone": {"type": "string", "maxLength": 6}, "hours": {"type": "integer"}},
            "required": ["zone", "hours"], "additionalProperties": False}}},
]


def random_schema(rng, depth=0):
    """A JSON Schema drawn from what strict mode and the coverage table allow, with every
    string bounded (a random-weights model writes a string until its bound)."""
    kinds = ["string", "integer", "number", "boolean", "enum", "nullable"]
    if depth < 2:
        kinds += ["object", "object", "array", "anyOf"]
    kind = rng.choice(kinds)
    if kind == "string":
        low = rng.choice([0, 0, 1, 2])
        return {"type": "string", "maxLength": rng.randint(low, 6),
                **({"minLength": low} if low else {})}
    if kind == "integer":
        return {"type": "integer"}
    if kind == "number":
        return {"type": "number"}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", 3, None, True, "a\"b"], rng.randint(1, 4))}
    if kind == "nullable":
        return {"type": [rng.choice(["integer", "boolean"]), "null"]}
    if kind == "array":
        return {"type": "array", "items": random_schema(rng, depth + 1),
                "maxItems": rng.randint(0, 3)}
    if kind == "anyOf":
        return {"anyOf": [random_schema(rng, depth + 1) for _ in range(rng.randint(1, 3))]}
    names = rng.sample(["id", "name", "tags", "ok", "x", "long name", "\u00e9t\u00e9"],
                       rng.randint(1, 4))
    properties = {n: random_schema(rng, depth + 1) for n in names}
    required = [n for n in names if rng.random() < 0.7]
    return {"type": "object", "properties": properties, "required": required,
            "additionalProperties": False}


class NotReadyTest(unittest.TestCase):
    """Against a scheduler whose workers never come."""

    def test_not_ready(self):
        self.assertEqual(get("/health"), (503, {"status": "not_serving"}))
        client = openai.OpenAI(base_url=ARGS.base_url + "/v1", api_key="unused", max_retries=0)
        with self.assertRaises(openai.APIStatusError) as raised:
            client.completions.create(model=ARGS.model, prompt="x")
        self.assertEqual(raised.exception.status_code, 503)
        self.assertIn("no model worker is ready", raised.exception.body["message"])


class QueueFullTest(unittest.TestCase):
    """Against a scheduler started with --max_queue=0: every request finds the queue full."""

    def test_queue_full(self):
        client = openai.OpenAI(base_url=ARGS.base_url + "/v1", api_key="unused", max_retries=0)
        with self.assertRaises(openai.RateLimitError) as raised:
            client.completions.create(model=ARGS.model, prompt="x", max_tokens=2)
        self.assertEqual(raised.exception.status_code, 429)
        self.assertEqual(raised.exception.body["type"], "rate_limit_error")
        self.assertIn("queue is full", raised.exception.body["message"])


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("test", help="a test method, e.g. test_logprobs")
    ARGS = parser.parse_args()
    test_class = {"test_not_ready": NotReadyTest,
                  "test_queue_full": QueueFullTest}.get(ARGS.test, OpenAiClientTest)
    suite = unittest.TestSuite([test_class(ARGS.test)])
    result = unittest.TextTestRunner(stream=sys.stderr, verbosity=2).run(suite)
    print("conveyor-http-test:", "PASS" if result.wasSuccessful() else "FAIL", flush=True)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
