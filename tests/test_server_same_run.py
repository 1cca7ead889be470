"""Issue 33, the recorder's side: a recording is the run llama-server makes of the same request. Against the real
llama-server (built by `mtpscope server build` from the llama.cpp llama-cpp-python 0.3.36 vendors) on 127.0.0.1 with
the trained demo pair:

* prompt forms: a text prompt is tokenized as `/completion` tokenizes a string (BOS added, `<|turn>` read as the
  special token: its id checked from the GGUF's vocabulary with gguf-py); a chat renders as `/apply-template` and
  `/v1/chat/completions` render it (their prompt token count); token ids go in as given;
* counting: per request, the server's `timings.draft_n` / `draft_n_accepted` and output tokens equal the
  recording's drafted / accepted / emitted, also where the drafter drafted an end-of-generation token that the
  target confirmed (llama.cpp counts it as the target's token, not as accepted: the trace's `eog_confirmed`);
* sampling: a seeded request at temperature 0.8 (the server's default top-k / top-p / min-p) gives the same
  tokens and counts.

Skips, saying why, where llama-server cannot be built here or is not built (`make setup` builds it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.llama]

#: one thread each: the test machine is shared
THREADS = ["--threads", "1", "--threads-batch", "1", "--spec-draft-threads", "1", "--spec-draft-threads-batch", "1"]
N_DRAFT, N_PREDICT, SEED = 3, 32, 11
#: demo prompts whose greedy run (3 drafts, 32 tokens) has a drafted end-of-generation token the target confirms
#: in a round where it is not the last draft, and a few without (found by running them; the test checks it holds)
GREEDY_PROMPTS = ("numbers:prompt:3", "numbers:prompt:8", "chat:prompt:5", "prose:topic:strings@2752", "code:dis.py:190")
SAMPLED_PROMPTS = ("chat:prompt:4", "numbers:prompt:15", "code:platform.py:1276", "json:prompt:1")
MESSAGES = ({"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Write a Python function called add that takes two numbers."})


@pytest.fixture(scope="module")
def pair(trained_pair):
    return trained_pair


@pytest.fixture(scope="module")
def client(server_bin, pair, tmp_path_factory):
    from mtpscope.traces.server.client import ServerClient
    from mtpscope.traces.server.launch import launch

    d = tmp_path_factory.mktemp("srv")
    with launch(pair.target, pair.drafter, n_draft=N_DRAFT, log=d / "server.log", binary=server_bin,
                extra=THREADS) as s, ServerClient(s.url) as c:
        yield c


@pytest.fixture(scope="module")
def runtime(pair):
    from mtpscope.traces.run.mtp_runtime import MtpRuntime

    with MtpRuntime(pair.target, pair.drafter, capture=False, n_gpu_layers=0, n_threads=1) as rt:
        yield rt


@pytest.fixture(scope="module")
def demo_prompts() -> dict[str, dict]:
    from mtpscope.demo.trained import read_prompts

    return {p["name"]: p for p in read_prompts()}


def _vocab_ids(path: Path) -> tuple[dict[str, int], int]:
    """The GGUF's token texts -> ids and its BOS id, read with gguf-py (not llama.cpp)."""
    from gguf import GGUFReader

    r = GGUFReader(path)
    f = r.fields["tokenizer.ggml.tokens"]
    ids = {bytes(f.parts[j]).decode("utf-8"): i for i, j in enumerate(f.data)}
    b = r.fields["tokenizer.ggml.bos_token_id"]
    return ids, int(b.parts[b.data[0]][0])


def test_text_prompt_reads_special_tokens_as_the_server_does(runtime, client, pair):
    from mtpscope.traces.run.mtp_runtime import spec_tokens
    from mtpscope.traces.run.prompts import PromptSpec

    ids, bos = _vocab_ids(pair.target)
    text = "<|turn>user\nWhat is 24 - 14?<turn|>\n<|turn>model\n"
    got, shown = spec_tokens(runtime.tmodel, PromptSpec(text=text))
    assert shown == text
    assert got[0] == bos and got[1] == ids["<|turn>"] and got.count(ids["<|turn>"]) == 2
    assert ids["<turn|>"] in got
    assert got == client.tokenize(text, add_special=True, parse_special=True)
    # what /completion reads from the same string: its prompt token count
    out = client.completion({"prompt": text, "n_predict": 1, "temperature": 0, "cache_prompt": False})
    assert out["timings"]["prompt_n"] == len(got)


def test_chat_renders_as_the_server_renders_it(runtime, client):
    from mtpscope.traces.run.mtp_runtime import spec_tokens
    from mtpscope.traces.run.prompts import PromptSpec

    got, text = spec_tokens(runtime.tmodel, PromptSpec(messages=MESSAGES))
    assert text == client.apply_template(MESSAGES)
    assert got == client.tokenize(text, add_special=True, parse_special=True)
    resp = client.json("POST", "/v1/chat/completions",
                       body={"messages": list(MESSAGES), "max_tokens": 1, "temperature": 0, "cache_prompt": False})
    assert resp["usage"]["prompt_tokens"] == len(got)
    # `record --chat`: a text as one user turn, the same rule
    one = [{"role": "user", "content": MESSAGES[1]["content"]}]
    assert spec_tokens(runtime.tmodel, PromptSpec(text=MESSAGES[1]["content"]), chat=True)[0] == \
        client.tokenize(client.apply_template(one), add_special=True, parse_special=True)


def test_token_ids_go_in_as_given(runtime, client, demo_prompts):
    from mtpscope.traces.run.mtp_runtime import spec_tokens
    from mtpscope.traces.run.prompts import PromptSpec

    ids = demo_prompts["chat:prompt:2"]["ids"]
    got, _ = spec_tokens(runtime.tmodel, PromptSpec(tokens=tuple(ids)))
    assert got == ids
    out = client.completion({"prompt": ids, "n_predict": 1, "temperature": 0, "cache_prompt": False})
    assert out["timings"]["prompt_n"] == len(ids)


def _same_request(runtime, client, ids: list[int], temp: float) -> tuple[tuple, tuple, int]:
    """(recording's tokens, drafted, accepted), (server's), the recording's confirmed end-of-generation drafts."""
    from mtpscope.traces.run.record_config import RecordConfig

    rounds = list(runtime.run(ids, RecordConfig(n_draft=N_DRAFT, max_tokens=N_PREDICT, temp=temp, seed=SEED),
                              trace=False))
    ours = ([runtime.first_token] + [t for r in rounds for t in r.emitted],
            sum(len(r.drafted) for r in rounds), sum(r.n_accepted for r in rounds))
    out = client.completion({"prompt": ids, "n_predict": N_PREDICT, "temperature": temp, "seed": SEED,
                             "return_tokens": True, "cache_prompt": False})
    theirs = (out["tokens"], out["timings"]["draft_n"], out["timings"]["draft_n_accepted"])
    return ours, theirs, sum(getattr(r, "eog_confirmed", False) for r in rounds)


def test_greedy_counts_follow_llama_cpp_at_end_of_generation(runtime, client, demo_prompts):
    n_eog = 0
    for name in GREEDY_PROMPTS:
        ours, theirs, eog = _same_request(runtime, client, demo_prompts[name]["ids"], 0.0)
        assert ours == theirs, name
        n_eog += eog
    assert n_eog >= 1      # the rule was exercised: a confirmed end-of-generation draft, not counted as accepted


def test_seeded_sampling_gives_the_servers_tokens_and_counts(runtime, client, demo_prompts):
    n_diff = 0
    for name in SAMPLED_PROMPTS:
        ids = demo_prompts[name]["ids"]
        ours, theirs, _ = _same_request(runtime, client, ids, 0.8)
        assert ours == theirs, name
        greedy, _, _ = _same_request(runtime, client, ids, 0.0)
        n_diff += greedy[0] != ours[0]
    assert n_diff >= 1     # sampling changed some output: the equality is not the greedy one
