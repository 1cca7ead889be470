"""The sweep spec and sweep.json (traces/sweep/spec.py): prompt sets with categories, shard assignment,
task ids, refusals, the state file's checks. No Ray, no llama.cpp."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtpscope.errors import MtpscopeError, TraceError, TraceFormatError
from mtpscope.traces.sweep.spec import (
    SweepPrompt,
    SweepSpec,
    SweepTask,
    assistant_name,
    check_out_dir,
    new_state,
    parse_assistant,
    read_prompt_set,
    read_state,
    write_state,
)


def _spec(n_prompts: int = 5, **kw) -> SweepSpec:
    prompts = tuple(SweepPrompt(i, f"p{i}", "c" if i % 2 else "d") for i in range(n_prompts))
    base = {"target": "/t.gguf", "assistants": (("a", "/a.gguf"),), "prompts": prompts, "n_drafts": (1, 3),
            "n_shards": 2, "baseline": True}
    base.update(kw)
    return SweepSpec(**base)


def test_prompt_set_categories(tmp_path: Path) -> None:
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "a", "category": "code"}\n"b"\n\n{"text": "c"}\n{"prompt": "d", "category": " math "}\n')
    got = read_prompt_set(p)
    assert [(x.index, x.text, x.category) for x in got] == [(0, "a", "code"), (1, "b", "default"),
                                                             (2, "c", "default"), (3, "d", "math")]
    txt = tmp_path / "p.txt"
    txt.write_text("one\n\ntwo\n")
    assert [x.category for x in read_prompt_set(txt)] == ["default", "default"]


def test_prompt_set_bad_category_names_the_line(tmp_path: Path) -> None:
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "a"}\n\n{"prompt": "b", "category": 3}\n')
    with pytest.raises(MtpscopeError, match="line 3"):
        read_prompt_set(p)


def test_prompt_set_takes_what_record_takes(tmp_path: Path) -> None:
    p = tmp_path / "p.jsonl"
    lines = [{"tokens": [2, 651, 13], "id": "t1", "domain": "ids"},
             {"messages": [{"role": "user", "content": "hi"}], "domain": "chat", "source_url": "x"},
             {"prompt": "plain", "domain": "story"}]
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    got = read_prompt_set(p)
    assert [x.category for x in got] == ["default"] * 3
    from mtpscope.traces.sweep.spec import prompt_set_note

    assert "--category-field domain" in prompt_set_note(got)
    got = read_prompt_set(p, category_field="domain")
    assert [x.category for x in got] == ["ids", "chat", "story"] and prompt_set_note(got) is None
    assert got[0].tokens == (2, 651, 13) and got[0].text == "" and got[0].id == "t1"
    assert got[1].messages == (("user", "hi"),) and dict(got[1].extra) == {"source_url": "x"}
    # what the recorder receives: the same prompt, its category included
    spec0 = got[0].prompt_spec()
    assert spec0.tokens == (2, 651, 13) and spec0.text is None and spec0.category == "ids" and spec0.id == "t1"
    assert got[1].prompt_spec().messages == ({"role": "user", "content": "hi"},)
    # sweep.json keeps them: a resumed sweep records the same prompts
    s = SweepSpec(target="/t.gguf", assistants=(("a", "/a.gguf"),), prompts=got, n_drafts=(2,), n_shards=1).check()
    st = new_state(s, command=["x"])
    assert st["prompts"][0]["tokens"] == [2, 651, 13] and st["prompts"][1]["messages"] == [{"role": "user",
                                                                                          "content": "hi"}]
    write_state(tmp_path, st)
    assert SweepSpec.from_state(read_state(tmp_path)) == s


def test_shards_round_robin_and_tasks() -> None:
    s = _spec(5).check()
    assert [p.index for p in s.shard_prompts(0)] == [0, 2, 4]
    assert [p.index for p in s.shard_prompts(1)] == [1, 3]
    ids = [t.task_id for t in s.tasks()]
    # interleaved shard by shard (a drift of the machine's speed hits every cell alike), plain decoding with
    # its shard
    assert ids == ["assistant=a/n_draft=1/shard=0", "assistant=a/n_draft=3/shard=0", "assistant=baseline/n_draft=0/shard=0",
                   "assistant=a/n_draft=1/shard=1", "assistant=a/n_draft=3/shard=1", "assistant=baseline/n_draft=0/shard=1"]
    st = new_state(s, command=["x"])
    # every prompt once, with its shard and position there
    assert [(p["index"], p["shard"], p["prompt_id"]) for p in st["prompts"]] == [
        (0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1), (4, 0, 2)]
    assert {t["state"] for t in st["tasks"]} == {"pending"}


def test_a_task_name_parses_back_to_its_task() -> None:
    """One home for the task name's format: ``SweepTask.parse_task_id`` reads back what ``task_id`` writes (every
    task of a spec, the baseline's, a name with '.' and '-'), and nothing else (was a regex in read_state that
    restated the format)."""
    tasks = [*_spec(5).check().tasks(), SweepTask("gemma-4.Q8_0", 12, 3)]
    for t in tasks:
        assert SweepTask.parse_task_id(t.task_id) == t
    for name in ("assistant=a/n_draft=1", "assistant=a/n_draft=x/shard=0", "assistant=/n_draft=1/shard=0",
                 "assistant=a/n_draft=1/shard=0/", "n_draft=1/assistant=a/shard=0", "assistant=a/b/n_draft=1/shard=0",
                 "assistant=a/n_draft=-1/shard=0", ""):
        assert SweepTask.parse_task_id(name) is None, name


@pytest.mark.parametrize(("kw", "match"), [
    ({"assistants": (("baseline", "/b.gguf"),)}, "reserved"),
    ({"assistants": (("a", "/a.gguf"), ("a", "/b.gguf"))}, "same name"),
    ({"n_drafts": (0,)}, "1..64"),
    ({"n_drafts": (65,)}, "1..64"),
    ({"n_drafts": (2, 2)}, "repeat"),
    ({"n_shards": 6}, "shards"),
    ({"n_shards": 0}, "shards"),
    ({"hidden": "bf16"}, "hidden"),
    ({"assistants": ()}, "at least one"),
    ({"prompts": (SweepPrompt(0, "x", "all"),), "n_shards": 1}, "reserved"),
])
def test_spec_refusals(kw: dict, match: str) -> None:
    with pytest.raises(MtpscopeError, match=match):
        _spec(5, **kw).check()


def test_assistant_names(tmp_path: Path) -> None:
    assert assistant_name("/m/gemma-4 assistant Q8_0.gguf") == "gemma-4-assistant-Q8_0"
    assert parse_assistant("q8=/m/x.gguf") == ("q8", "/m/x.gguf")
    assert parse_assistant("/m/x.gguf") == ("x", "/m/x.gguf")
    odd = tmp_path / "a=b.gguf"          # an existing file whose name has '=' is a path, not NAME=PATH
    odd.write_bytes(b"")
    assert parse_assistant(str(odd)) == ("a-b", str(odd))
    with pytest.raises(MtpscopeError, match="bad assistant name"):
        parse_assistant("bad name!=/m/x.gguf")


def test_state_roundtrip_and_spec_differences(tmp_path: Path) -> None:
    s = _spec(4).check()
    st = new_state(s, command=["mtpscope", "sweep"])
    write_state(tmp_path, st)
    back = read_state(tmp_path)
    assert SweepSpec.from_state(back) == s
    other = _spec(4, n_drafts=(1, 2)).check()
    diff = s.differences(other)
    assert diff == ["n_draft: [1, 3] vs [1, 2]"]
    assert not list(tmp_path.glob(".sweep.json.tmp*"))


def test_state_file_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="no sweep.json"):
        read_state(tmp_path)
    (tmp_path / "sweep.json").write_text('{"sweep_version": 1, "spec": {}, "prompts": [], "tasks": [')
    with pytest.raises(TraceFormatError, match="not valid JSON") as e:
        read_state(tmp_path)
    assert e.value.offset is not None
    st = new_state(_spec(2, n_shards=1).check(), command=[])
    st["tasks"][0]["dir"] = "../../etc"
    (tmp_path / "sweep.json").write_text(json.dumps(st))
    with pytest.raises(TraceFormatError, match="inside the sweep directory"):
        read_state(tmp_path)
    st["tasks"][0]["dir"] = "x"
    st["tasks"][0]["state"] = "weird"
    (tmp_path / "sweep.json").write_text(json.dumps(st))
    with pytest.raises(TraceFormatError, match="tasks\\[0\\]"):
        read_state(tmp_path)
    st["sweep_version"] = 9
    (tmp_path / "sweep.json").write_text(json.dumps(st))
    with pytest.raises(TraceFormatError, match="version"):
        read_state(tmp_path)


def test_out_dir_checks(tmp_path: Path) -> None:
    check_out_dir(tmp_path / "new", resume=False)
    with pytest.raises(TraceError, match="no sweep here"):
        check_out_dir(tmp_path, resume=True)
    write_state(tmp_path, new_state(_spec(2, n_shards=1).check(), command=[]))
    with pytest.raises(TraceError, match="--resume"):
        check_out_dir(tmp_path, resume=False)
    check_out_dir(tmp_path, resume=True)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "manifest.json").write_text("{}")
    with pytest.raises(TraceError, match="holds a trace"):
        check_out_dir(tmp_path / "t", resume=False)


def test_spec_differences_compare_prompt_texts_not_their_file() -> None:
    s = _spec(4).check()
    moved = SweepSpec(**{**s.__dict__, "prompts_file": "/elsewhere.jsonl", "prompts_sha256": "x"})
    assert s.differences(moved) == []
    edited = SweepSpec(**{**s.__dict__, "prompts": (SweepPrompt(0, "changed", "d"), *s.prompts[1:])})
    assert s.differences(edited) == ["prompts: texts or categories differ"]
