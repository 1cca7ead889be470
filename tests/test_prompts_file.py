"""Prompts files (.jsonl objects with category / id / tokens / messages) and their one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtpscope.errors import MtpscopeError
from mtpscope.traces.run.prompts import PromptSpec, check_tokens, read_prompt_specs


def _file(tmp_path: Path, lines: list, name: str = "p.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("\n".join(x if isinstance(x, str) and x.startswith("#raw ") is False and not isinstance(x, str)
                           else (x[5:] if isinstance(x, str) and x.startswith("#raw ") else json.dumps(x))
                           for x in lines) + "\n")
    return p


def test_all_fields(tmp_path: Path) -> None:
    p = _file(tmp_path, ["plain text", {"prompt": "a", "category": "code", "id": "q1", "source_url": "x", "n": 3},
                         {"tokens": [2, 651, 13], "id": 7},
                         {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
                          "category": "chat"}, "#raw ", {"text": "b"}])
    specs = read_prompt_specs(p)
    assert [s.source for s in specs] == ["text", "text", "tokens", "messages", "text"]
    assert specs[0].text == "plain text" and specs[0].line == 1
    assert specs[1].category == "code" and specs[1].id == "q1" and specs[1].extra == {"source_url": "x", "n": 3}
    assert specs[2].tokens == (2, 651, 13) and specs[2].id == "7"
    assert specs[3].messages[1] == {"role": "user", "content": "hi"}
    assert specs[4].text == "b" and specs[4].line == 6            # the blank line 5 is skipped
    e = specs[1].manifest_entry(1, 4)
    assert e == {"prompt_id": 1, "text": "a", "n_prompt_tokens": 4, "id": "q1", "category": "code",
                 "extra": {"source_url": "x", "n": 3}}
    e2 = specs[2].manifest_entry(2, 3, text="<bos>hello")
    assert e2["tokens"] == [2, 651, 13] and e2["source"] == "tokens" and e2["text"] == "<bos>hello"
    txt = tmp_path / "p.txt"
    txt.write_text("one\n\n two \n")
    assert [s.text for s in read_prompt_specs(txt)] == ["one", " two "]


@pytest.mark.parametrize("line, key, fragment", [
    ({"category": "x"}, "line 2: prompt", "exactly one"),
    ({"prompt": "a", "tokens": [1]}, "line 2: prompt/tokens", "exactly one"),
    ({"prompt": 3}, "line 2: prompt", "must be a string"),
    ({"tokens": [1, "a"]}, "line 2: tokens[1]", "non-negative integer"),
    ({"tokens": []}, "line 2: tokens", "non-empty"),
    ({"messages": [{"role": "user"}]}, "line 2: messages[0].content", "must be a string"),
    ({"messages": "hi"}, "line 2: messages", "non-empty list"),
    ({"prompt": "a", "id": True}, "line 2: id", "string or an integer"),
    ({"prompt": "a", "category": 5}, "line 2: category", "non-empty string"),
    ({"prompt": "b", "id": "q"}, "line 2: id", "repeats the id of line 1"),
    ("#raw {not json", "line 2: json", "is not JSON"),
    (17, "line 2: prompt", "JSON string or an object"),
])
def test_bad_line_is_one_error(tmp_path: Path, line, key, fragment) -> None:
    p = _file(tmp_path, [{"prompt": "a", "id": "q"}, line])
    with pytest.raises(MtpscopeError) as ei:
        read_prompt_specs(p)
    assert ei.value.key == key and fragment in ei.value.message and ei.value.path == str(p)
    assert "\n" not in str(ei.value) and str(p) in str(ei.value)


def test_tokens_checked_against_the_vocabulary(tmp_path: Path) -> None:
    s = read_prompt_specs(_file(tmp_path, [{"tokens": [5, 262144]}]))[0]
    with pytest.raises(MtpscopeError) as ei:
        check_tokens(s, 262144)
    assert ei.value.key == "line 1: tokens[1]" and ei.value.actual == 262144
    check_tokens(PromptSpec(tokens=(0, 262143)), 262144)


def test_not_utf8_and_empty(tmp_path: Path) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_bytes(b'"ok"\n"\xff"\n')
    with pytest.raises(MtpscopeError) as ei:
        read_prompt_specs(p)
    assert ei.value.offset == 6
    e = tmp_path / "e.jsonl"
    e.write_text("\n\n")
    with pytest.raises(MtpscopeError):
        read_prompt_specs(e)


def test_a_byte_order_mark_is_not_text(tmp_path: Path) -> None:
    """A UTF-8 byte-order mark (some editors write one) became part of a text file's first prompt ('\ufeffhello', one
    token more) and made a .jsonl file's first line "not JSON"; both now read as without it; a bad byte after it is
    named at its offset in the file."""
    bom = b"\xef\xbb\xbf"
    t, j, bad = tmp_path / "p.txt", tmp_path / "p.jsonl", tmp_path / "bad.txt"
    t.write_bytes(bom + b"hello\nworld\n")
    j.write_bytes(bom + b'{"prompt": "hello"}\n"world"\n')
    assert [s.text for s in read_prompt_specs(t)] == ["hello", "world"]
    assert [s.text for s in read_prompt_specs(j)] == ["hello", "world"]
    bad.write_bytes(bom + b"ok\n\xff\n")
    with pytest.raises(MtpscopeError) as ei:
        read_prompt_specs(bad)
    assert ei.value.offset == 6


def test_a_json_file_is_refused_not_read_as_one_text_line(tmp_path: Path) -> None:
    """`prompts.json` holding a JSON array was recorded as one prompt (the array's text); now one line says to
    write JSON lines or text lines. Other suffixes stay text lines."""
    p = tmp_path / "prompts.JSON"
    p.write_text(json.dumps(["first prompt", "second prompt"]))
    with pytest.raises(MtpscopeError) as ei:
        read_prompt_specs(p)
    assert ei.value.one_line() == (f"{p}: a .json prompts file: write one prompt per line as JSON lines (.jsonl: a "
                                   "string or an object each) or as plain text lines (expected .jsonl, or text lines, "
                                   "got .json)")
    t = tmp_path / "prompts.txt"
    t.write_text(json.dumps(["first prompt", "second prompt"]) + "\n")
    assert [s.text for s in read_prompt_specs(t)] == ['["first prompt", "second prompt"]']


def test_category_under_another_field(tmp_path: Path) -> None:
    from mtpscope.traces.run.prompts import category_note

    p = _file(tmp_path, [{"prompt": "a", "domain": "code", "category": "x"}, {"prompt": "b", "domain": 3}])
    specs = read_prompt_specs(p, category_field="domain")
    # the named field is the category (a number by its text); 'category' is then an ordinary extra field
    assert [s.category for s in specs] == ["code", "3"] and specs[0].extra == {"category": "x"}
    plain = read_prompt_specs(_file(tmp_path, [{"prompt": "a", "task": "qa", "type": "x"},
                                               {"prompt": "b", "task": "sum", "type": "y"}], "q.jsonl"))
    note = category_note(plain)
    # 'type' comes before 'task' in the suggestions; both are named
    assert note == ("prompts have no 'category' but a 'type' field (also 'task'): pass --category-field type to "
                    "break the results down by it")
    assert category_note(specs) is None
    with pytest.raises(MtpscopeError) as ei:
        read_prompt_specs(_file(tmp_path, [{"prompt": "a", "domain": ["x"]}], "r.jsonl"), category_field="domain")
    assert ei.value.key == "line 1: domain"
