"""The token classifier on hand-labelled spans.

The real Gemma 4 tokenizer (llama.cpp's own tokenize, through the demo target which carries every
``tokenizer.*`` key of the real vocab GGUF) cuts each text into tokens; character spans of the text are
labelled by hand below, and every token lying inside a span must get that span's label. Token offsets
come from llama.cpp's ``token_to_piece``, not from our piece decoding.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mtpscope.traces.analysis.token_classes import CHANNELS, CLASSES, Classifier, classify_ids, piece_text, text_class
from mtpscope.traces.analysis.vocab import Vocab, load_vocab


@pytest.fixture(scope="module")
def vocab(vocab_gguf):
    return load_vocab(vocab_gguf)


@pytest.fixture(scope="module")
def tok(demo_dir):
    pytest.importorskip("llama_cpp")
    from mtpscope.traces.run.llama import model as lm

    m = lm.LlamaModel(demo_dir.target)
    yield m
    m.close()


def _spans(tok, text, special=False):
    """(ids, [(start, end)] character span of each token) via llama.cpp."""
    ids = tok.tokenize(text, add_special=False, parse_special=special)
    out, pos = [], 0
    for t in ids:
        piece = tok.token_to_piece(t).decode("utf-8", "replace")
        if special and piece.startswith("<") and text.startswith(piece, pos):
            pass
        out.append((pos, pos + len(piece)))
        pos += len(piece)
    assert pos == len(text), "token pieces must rebuild the text"
    return ids, out


def _labels_inside(text, spans, labels, sub, start=0):
    """Labels of the tokens lying entirely inside the first occurrence of ``sub`` (at or after ``start``)."""
    a = text.index(sub, start)
    b = a + len(sub)
    return [lab for (s, e), lab in zip(spans, labels) if s >= a and e <= b and e > s]


MARKDOWN = ('Sure, here is the code:\n```python\ndef f(x):\n    return x + 1\n```\n'
            'The result is {"name": "Ada", "age": 36, "tags": [true, null]} and that is all.\n'
            'Use `np.array` here. Total: 1234 items\n\n')


def test_markdown_code_json_prose(tok, vocab) -> None:
    ids, spans = _spans(tok, MARKDOWN)
    labels = Classifier(vocab).classify(ids).class_names()

    def inside(sub: str, start: int = 0) -> list[str]:
        return _labels_inside(MARKDOWN, spans, labels, sub, start)

    assert set(inside("```python\ndef f(x):\n    return x + 1\n```")) == {"code"}
    assert set(inside("Sure, here is the code")) <= {"prose", "punctuation"}
    assert "prose" in inside("Sure, here is the code")
    # an inline JSON object is json, values included, up to its closing brace; the sentence goes on
    assert set(inside('{"name": "Ada", "age": 36, "tags": [true, null]}')) == {"json"}
    assert set(inside(" and that is all")) == {"prose"}
    assert set(inside("`np.array`")) == {"code"}
    assert set(inside("1234")) == {"number"}
    assert set(inside("\n\n", MARKDOWN.index("items"))) == {"whitespace"}
    assert inside(" here.")[0] == "prose"


def test_chat_channels(tok, vocab) -> None:
    text = "<|channel>thought\nI should add.<channel|>The sum is 4.<|tool_call>call:add{a:1}<tool_call|>"
    ids, spans = _spans(tok, text, special=True)
    tc = Classifier(vocab, chat=True).classify(ids)
    labels, chans = tc.class_names(), tc.channel_names()

    def by(sub: str) -> list[str]:
        return _labels_inside(text, spans, chans, sub)

    assert set(by("<|channel>thought\nI should add.<channel|>")) == {"thinking"}
    assert set(by("The sum is 4.")) == {"answer"}
    assert set(by("<|tool_call>call:add{a:1}<tool_call|>")) == {"tool_call"}
    for special in ("<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>"):
        assert _labels_inside(text, spans, labels, special) == ["special"]
    assert _labels_inside(text, spans, labels, "4") == ["number"]
    # the prompt's generation header puts chat output in the answer channel; plain text is "none"
    assert set(Classifier(vocab).classify(tok.tokenize("Hi there", add_special=False)).channel_names()) == {"none"}


def test_prefix_sets_the_context(tok, vocab) -> None:
    pre = tok.tokenize("Here:\n```js\n", add_special=False)
    ids = tok.tokenize("let a = 1;\n```\nDone", add_special=False)
    names = Classifier(vocab).classify(ids, prefix=pre).class_names()
    text = "let a = 1;\n```\nDone"
    _, spans = _spans(tok, text)
    assert set(_labels_inside(text, spans, names, "let a = 1;\n```")) == {"code"}
    assert _labels_inside(text, spans, names, "Done") == ["prose"]


def _v(pieces, types=None):
    return Vocab(pieces, types)


def test_rules_on_a_small_vocabulary() -> None:
    #            0     1      2      3    4     5      6       7       8        9       10        11
    pieces = ["{", "x", "}", "\u2581ok", '"', "a", '":', "\u2581[", "1", "],\u2581", "```", "json\n"]
    v = _v(pieces + ["<0x0A>", "<|channel>", "<channel|>", "\u2581\u2581"],
           [1] * 12 + [6, 4, 4, 1])
    # "{x} ok" is not JSON (no key): punctuation and prose
    assert classify_ids(v, [0, 1, 2, 3]) == ["punctuation", "prose", "punctuation", "prose"]
    # a line opening an object with a key is JSON, its number included
    assert classify_ids(v, [0, 4, 5, 6, 7, 8, 9]) == ["json"] * 7
    # a json fence: the fence line is code, the block json
    assert classify_ids(v, [10, 11, 0, 4, 5, 6, 8, 2]) == ["code", "code"] + ["json"] * 6
    assert piece_text("<0x0A>", 6) == "\n" and piece_text("\u2581the") == " the" and piece_text("<0xE2>", 6) == "\ufffd"
    assert [CLASSES[text_class(t)] for t in ("  ", "-3.5e2", "12%", "?!", "§", "word", "")] == \
        ["whitespace", "number", "number", "punctuation", "punctuation", "prose", "prose"]
    assert classify_ids(v, [99]) == ["unknown"]
    # without token types the template tokens are still recognised by their text
    v2 = _v(["<|channel>", "hi", "<channel|>", "yes"])
    tc = Classifier(v2).classify([0, 1, 2, 3])
    assert tc.class_names() == ["special", "prose", "special", "prose"]
    assert [CHANNELS[c] for c in tc.channels] == ["thinking", "thinking", "thinking", "answer"]


def test_what_was_written_prompt_and_output_together(tok, vocab) -> None:
    # Python without fences: the prompt opens a function, the output continues it (docstring included)
    pre = tok.tokenize('def area(r):\n    """Area of a circle.\n', add_special=False)
    out_text = '    Radius r in metres.\n    """\n    return 3.14 * r ** 2\n\nThe area grows with r.'
    ids, spans = _spans(tok, out_text)
    names = Classifier(vocab).classify(ids, prefix=pre).class_names()

    def inside(sub: str) -> list[str]:
        return _labels_inside(out_text, spans, names, sub)

    assert set(inside('    Radius r in metres.\n    """\n    return 3.14 * r ** 2\n')) == {"code"}
    assert set(inside("The area grows with r")) == {"prose"}
    # JSON whose opening brace is in the prompt: the output has none, it is json all the same
    pre = tok.tokenize('[\n  {\n    "city": "Lima",\n', add_special=False)
    out_text = '    "temp": -4.5,\n    "ok": true\n  }\n]\nThat is the list.'
    ids, spans = _spans(tok, out_text)
    names = Classifier(vocab).classify(ids, prefix=pre).class_names()
    assert set(_labels_inside(out_text, spans, names, '    "temp": -4.5,\n    "ok": true\n  }\n]')) == {"json"}
    assert set(_labels_inside(out_text, spans, names, "That is the list")) == {"prose"}
    # the prompt as text works the same way
    assert Classifier(vocab).classify(ids, prefix='[\n  {\n    "city": "Lima",\n').class_names() == names
    # numbers as written: a decimal point and a sign belong to the number, digits in a word to the word
    text = "Version 1.6 of s30 costs -4.5 units, 12% more."
    ids, spans = _spans(tok, text)
    names = Classifier(vocab).classify(ids).class_names()
    assert set(_labels_inside(text, spans, names, "1.6")) == {"number"}
    assert set(_labels_inside(text, spans, names, "-4.5")) == {"number"}
    assert set(_labels_inside(text, spans, names, "12%")) == {"number"}
    assert set(_labels_inside(text, spans, names, "s30")) == {"prose"}


DATA = Path(__file__).resolve().parent / "data" / "token_classes_labels.json"


def test_hand_labelled_generated_tokens(vocab) -> None:
    """Per-class precision and recall on tokens labelled by hand (tests/data/token_classes_labels.json,
    how: its ``how`` field). Required: >= 0.9 for code, json, number and prose."""
    import json
    from collections import Counter

    doc = json.loads(DATA.read_text())
    names = {v: k for k, v in doc["letters"].items()}
    tp, fp, fn, n = Counter(), Counter(), Counter(), 0
    for s in doc["sets"]:
        for p in s["prompts"]:
            want = [doc["letters"][c] for c in p["labels"]]
            got = Classifier(vocab).classify(p["ids"], prefix=p["prompt_ids"]).class_names()
            assert len(want) == len(got) == len(p["ids"])
            n += len(want)
            for a, b in zip(want, got):
                if a == b:
                    tp[a] += 1
                else:
                    fp[b] += 1
                    fn[a] += 1
    assert n >= 2000 and set(names) <= set(CLASSES)
    lines = [f"{n} hand-labelled tokens", f"{'class':<12} {'tokens':>6} {'precision':>9} {'recall':>6}"]
    for c in CLASSES:
        if tp[c] + fn[c] == 0:
            continue
        prec = tp[c] / (tp[c] + fp[c]) if tp[c] + fp[c] else float("nan")
        rec = tp[c] / (tp[c] + fn[c])
        lines.append(f"{c:<12} {tp[c] + fn[c]:6d} {prec:9.3f} {rec:6.3f}")
        if c in ("code", "json", "number", "prose"):
            assert prec >= 0.9 and rec >= 0.9, (c, prec, rec)
    print("\n".join(lines))


def test_doctests_and_json_without_its_brace(tok, vocab) -> None:
    # an interactive-prompt line is code; the indented text after it is not
    text = 'Example:\n   >>> len("ab")\n   The length of the string.\n'
    ids, spans = _spans(tok, text)
    names = Classifier(vocab).classify(ids).class_names()
    assert set(_labels_inside(text, spans, names, '>>> len("ab")')) == {"code"}
    assert set(_labels_inside(text, spans, names, "The length of the string")) == {"prose"}
    # key / value pairs written without their opening brace, in the middle of a line
    text = 'it is "name": "P-024", "price": 153.43, "tags": ["a",\n'
    ids, spans = _spans(tok, text)
    names = Classifier(vocab).classify(ids).class_names()
    assert set(_labels_inside(text, spans, names, '"name": "P-024", "price": 153.43, "tags": ["a",')) == {"json"}
    assert set(_labels_inside(text, spans, names, "it is")) == {"prose"}
    # one pair alone is not enough to call prose JSON
    text = 'The field "name": it holds the name.'
    ids, spans = _spans(tok, text)
    assert "json" not in Classifier(vocab).classify(ids).class_names()
    # a JSON document cut in the middle of a key stays JSON
    pre = tok.tokenize('[\n  {\n    "a": 1,\n', add_special=False)
    text = '    "b": 2,\n    "ki'
    ids, spans = _spans(tok, text)
    assert set(Classifier(vocab).classify(ids, prefix=pre).class_names()) == {"json"}
