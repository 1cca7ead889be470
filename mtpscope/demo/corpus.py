"""Training text for the trained demo pair, built from what every Python installation has.

Six categories with clearly different predictability (docs/DEMO.md, "The trained pair"):

* ``code``: Python standard-library sources (top-level ``*.py`` files of ``sysconfig``'s stdlib path);
* ``prose``: ``pydoc_data.topics`` (the interpreter's own reference topics) and the Python license text;
* ``json``: generated JSON records (users, products, events, sensor readings) from seeded word lists;
* ``numbers``: generated lists of numbers (arithmetic and geometric sequences, tables, squares,
  Fibonacci-like sequences);
* ``chat``: generated conversations (arithmetic, capitals, definitions taken from the topics, small
  code requests) rendered with the Gemma 4 chat template, so the template's special tokens and turn
  structure are in the data;
* ``random``: no text here: :mod:`mtpscope.demo.train` adds documents of words drawn at random from a
  small pool of frequent word tokens (the demo's unpredictable prompts are cut from them).

Everything is a pure function of the seed and of the interpreter's own files (the recipe records the
Python version and a hash of the text). Nothing here needs torch or llama.cpp: the text is rendered
here and tokenized by :mod:`mtpscope.demo.train` with llama.cpp's own tokenizer.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtpscope.errors import MtpscopeError

CATEGORIES = ("code", "prose", "json", "numbers", "chat", "random")

#: characters of text per category in the default recipe (about 0.13 M tokens in all: small enough for the
#: tiny target to see each document ~15 times, so its greedy continuations of training text follow
#: the text instead of looping)
DEFAULT_BUDGET = {"code": 140_000, "prose": 70_000, "json": 50_000, "numbers": 20_000, "chat": 70_000}

# files that are data rather than code, or huge generated tables
_CODE_SKIP = {"this.py", "antigravity.py", "__phello__.foo.py", "_pydecimal.py", "pydoc.py", "_aix_support.py",
              "_osx_support.py", "_sysconfigdata__linux_x86_64-linux-gnu.py", "_pyio.py"}
_CODE_MAX_BYTES = 90_000


@dataclass(frozen=True)
class Document:
    """One training document.

    Attributes:
        category: one of :data:`CATEGORIES`.
        name: where it came from (``"code:json/encoder.py"``, ``"json:17"``, ...).
        text: the text; for ``chat`` it is the rendered template, special tokens written as text
            (``<|turn>``, ``<turn|>``, ...) and tokenized with special-token parsing on.
    """

    category: str
    name: str
    text: str


# --------------------------------------------------------------------------------------------------
# code and prose: the interpreter's own files


def stdlib_dir() -> Path:
    """The standard library folder (``sysconfig.get_paths()["stdlib"]``)."""
    return Path(sysconfig.get_paths()["stdlib"])


def code_documents(budget: int, rng: random.Random) -> list[Document]:
    """Top-level stdlib modules, in a seeded order, until ``budget`` characters.

    Raises:
        MtpscopeError: the stdlib folder holds no Python sources.
    """
    root = stdlib_dir()
    files = sorted(p for p in root.glob("*.py")
                   if p.name not in _CODE_SKIP and p.stat().st_size <= _CODE_MAX_BYTES)
    if not files:
        raise MtpscopeError("no Python sources found in the standard library folder", path=root)
    rng.shuffle(files)
    out: list[Document] = []
    used = 0
    for p in files:
        if used >= budget:
            break
        text = p.read_text(encoding="utf-8", errors="replace")
        text = text[: budget - used] if used + len(text) > budget else text
        out.append(Document("code", f"code:{p.name}", text))
        used += len(text)
    return out


def prose_documents(budget: int, rng: random.Random) -> list[Document]:
    """``pydoc_data.topics`` entries (in a seeded order) and the Python license, until ``budget``
    characters."""
    from pydoc_data.topics import topics  # stdlib, loaded only when building

    docs = [Document("prose", f"prose:topic:{k}", v.strip() + "\n") for k, v in sorted(topics.items())]
    lic = stdlib_dir() / "LICENSE.txt"
    if lic.exists():
        text = lic.read_text(encoding="utf-8", errors="replace")
        # the license is long and repetitive: keep its first part
        docs.append(Document("prose", "prose:LICENSE.txt", text[:24_000]))
    rng.shuffle(docs)
    out: list[Document] = []
    used = 0
    for d in docs:
        if used >= budget:
            break
        text = d.text[: budget - used]
        out.append(Document("prose", d.name, text))
        used += len(text)
    return out


# --------------------------------------------------------------------------------------------------
# generated records: seeded word lists (written here, no data files)

FIRST = ("Alice", "Bruno", "Chen", "Dmitri", "Elena", "Farah", "Gustav", "Hana", "Ivan", "Julia", "Kofi", "Laura",
         "Mateo", "Nadia", "Oscar", "Priya", "Quentin", "Rosa", "Samir", "Tanja", "Umar", "Vera", "Wei", "Yusuf",
         "Zoe", "Marta", "Pedro", "Ingrid", "Tomas", "Leila")
LAST = ("Smith", "Garcia", "Müller", "Kowalski", "Rossi", "Dubois", "Tanaka", "Silva", "Novak", "Jensen", "Costa",
        "Schmidt", "Ivanova", "Okafor", "Nguyen", "Larsen", "Moreau", "Haddad", "Fischer", "Santos")
CITIES = ("Lisbon", "Berlin", "Kyoto", "Nairobi", "Toronto", "Lima", "Oslo", "Madrid", "Seoul", "Dublin", "Prague",
          "Cairo", "Austin", "Porto", "Vienna", "Chennai", "Krakow", "Bogota", "Helsinki", "Perth")
COUNTRIES = (("France", "Paris"), ("Germany", "Berlin"), ("Japan", "Tokyo"), ("Kenya", "Nairobi"),
             ("Canada", "Ottawa"), ("Peru", "Lima"), ("Norway", "Oslo"), ("Spain", "Madrid"),
             ("South Korea", "Seoul"), ("Ireland", "Dublin"), ("Czechia", "Prague"), ("Egypt", "Cairo"),
             ("Portugal", "Lisbon"), ("Austria", "Vienna"), ("India", "New Delhi"), ("Poland", "Warsaw"),
             ("Colombia", "Bogota"), ("Finland", "Helsinki"), ("Australia", "Canberra"), ("Brazil", "Brasilia"),
             ("Italy", "Rome"), ("Greece", "Athens"), ("Chile", "Santiago"), ("Mexico", "Mexico City"),
             ("Sweden", "Stockholm"), ("Denmark", "Copenhagen"), ("Ghana", "Accra"), ("Vietnam", "Hanoi"),
             ("Argentina", "Buenos Aires"), ("Turkey", "Ankara"))
PRODUCTS = ("keyboard", "monitor", "lamp", "backpack", "kettle", "notebook", "headphones", "chair", "bicycle",
            "umbrella", "camera", "blender", "jacket", "teapot", "printer", "drill", "tent", "watch")
COLORS = ("red", "blue", "green", "black", "white", "silver", "orange", "purple", "grey", "yellow")
EVENTS = ("login", "logout", "purchase", "signup", "page_view", "error", "upload", "download", "search", "refund")
TAGS = ("new", "sale", "popular", "limited", "eco", "premium", "gift", "outdoor", "office", "kitchen")
UNITS = (("temperature", "C"), ("humidity", "%"), ("pressure", "hPa"), ("wind_speed", "m/s"))


def _user(rng: random.Random, i: int) -> dict[str, Any]:
    first, last = rng.choice(FIRST), rng.choice(LAST)
    return {"id": i, "name": f"{first} {last}", "email": f"{first.lower()}.{last.lower()}@example.com",
            "age": rng.randint(18, 80), "city": rng.choice(CITIES), "active": rng.random() < 0.7}


def _product(rng: random.Random, i: int) -> dict[str, Any]:
    return {"sku": f"P-{i:05d}", "name": f"{rng.choice(COLORS)} {rng.choice(PRODUCTS)}",
            "price": round(rng.uniform(2, 400), 2), "in_stock": rng.random() < 0.8,
            "tags": rng.sample(TAGS, rng.randint(1, 3))}


def _event(rng: random.Random, i: int) -> dict[str, Any]:
    return {"event": rng.choice(EVENTS), "user_id": rng.randint(1, 999),
            "timestamp": f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:"
                         f"{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z",
            "ok": rng.random() < 0.9}


def _reading(rng: random.Random, i: int) -> dict[str, Any]:
    name, unit = rng.choice(UNITS)
    return {"sensor": f"s{rng.randint(1, 40)}", "kind": name, "value": round(rng.uniform(-10, 100), 1),
            "unit": unit, "station": rng.choice(CITIES)}


_RECORDS = (_user, _product, _event, _reading)


def json_text(rng: random.Random) -> str:
    """One JSON document: an array of 2-6 records of one kind, pretty-printed or compact."""
    make = rng.choice(_RECORDS)
    start = rng.randint(1, 5000)
    rows = [make(rng, start + j) for j in range(rng.randint(2, 6))]
    if rng.random() < 0.6:
        return json.dumps(rows, indent=2, ensure_ascii=False) + "\n"
    return "\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n"


def json_documents(budget: int, rng: random.Random) -> list[Document]:
    """Generated JSON documents until ``budget`` characters."""
    out: list[Document] = []
    used = 0
    while used < budget:
        t = json_text(rng)
        out.append(Document("json", f"json:{len(out)}", t))
        used += len(t)
    return out


def numbers_text(rng: random.Random) -> str:
    """One list of numbers: an arithmetic or geometric sequence, a multiplication table, squares, or a
    Fibonacci-like sequence (every one continues by a rule)."""
    kind = rng.randrange(5)
    if kind == 0:
        a, d = rng.randint(0, 500), rng.randint(1, 12)
        return ", ".join(str(a + d * i) for i in range(rng.randint(12, 30))) + "\n"
    if kind == 1:
        k = rng.randint(2, 12)
        return "\n".join(f"{k} x {i} = {k * i}" for i in range(1, rng.randint(8, 13))) + "\n"
    if kind == 2:
        s = rng.randint(1, 20)
        return "\n".join(f"{i}^2 = {i * i}" for i in range(s, s + rng.randint(8, 15))) + "\n"
    if kind == 3:
        b = rng.choice((2, 3))   # (powers of 10 are runs of zeros: repetitive by themselves)
        return ", ".join(str(b ** i) for i in range(rng.randint(8, 16))) + "\n"
    a, b = rng.randint(0, 5), rng.randint(1, 5)
    seq = [a, b]
    while len(seq) < rng.randint(10, 20):
        seq.append(seq[-1] + seq[-2])
    return ", ".join(map(str, seq)) + "\n"


def number_documents(budget: int, rng: random.Random) -> list[Document]:
    """Generated number lists until ``budget`` characters."""
    out: list[Document] = []
    used = 0
    while used < budget:
        t = numbers_text(rng)
        out.append(Document("numbers", f"numbers:{len(out)}", t))
        used += len(t)
    return out


# --------------------------------------------------------------------------------------------------
# chat: conversations rendered with the Gemma 4 chat template

SYSTEMS = ("You are a helpful assistant.", "Answer briefly.", "You are a concise Python tutor.",
           "Reply in plain English.")


def _first_sentences(text: str, n: int = 2) -> str:
    body = " ".join(line.strip() for line in text.split("\n")[2:] if line.strip() and not line.startswith(("*", "=")))
    parts = body.split(". ")
    return ". ".join(parts[:n]).strip().rstrip(".") + "."


def _qa(rng: random.Random, topics: list[tuple[str, str]]) -> tuple[str, str]:
    # (no "explain a topic" question: a tiny model cannot recall a topic's text from its name, and its
    # greedy answer then loops)
    kind = rng.choice((0, 1, 3, 4, 5))
    if kind == 0:
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        op = rng.choice("+-*")
        val = a + b if op == "+" else a - b if op == "-" else a * b
        return f"What is {a} {op} {b}?", f"{a} {op} {b} = {val}."
    if kind == 1:
        country, capital = rng.choice(COUNTRIES)
        return f"What is the capital of {country}?", f"The capital of {country} is {capital}."
    if kind == 3:
        fn = rng.choice(("add", "multiply", "subtract"))
        sym = {"add": "+", "multiply": "*", "subtract": "-"}[fn]
        return (f"Write a Python function called {fn} that takes two numbers.",
                f"Here is the function:\n\n```python\ndef {fn}(a, b):\n    return a {sym} b\n```")
    if kind == 4:
        u = _user(rng, rng.randint(1, 500))
        return (f"Give me a JSON record for a user named {u['name']} from {u['city']}.",
                "```json\n" + json.dumps(u, indent=2, ensure_ascii=False) + "\n```")
    k, n = rng.randint(2, 12), rng.randint(5, 10)
    return (f"List the first {n} multiples of {k}.", ", ".join(str(k * i) for i in range(1, n + 1)) + ".")


def chat_messages(rng: random.Random, topics: list[tuple[str, str]]) -> list[dict[str, str]]:
    """One conversation: an optional system turn and 1-3 user/assistant exchanges."""
    msgs: list[dict[str, str]] = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": rng.choice(SYSTEMS)})
    for _ in range(rng.randint(1, 3)):
        q, a = _qa(rng, topics)
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return msgs


@functools.lru_cache(maxsize=4)
def _compiled(template: str) -> Any:
    import jinja2.sandbox

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template)


def render_chat(template: str, messages: list[dict[str, str]], *, add_generation_prompt: bool = False) -> str:
    """Render ``messages`` with a Jinja chat template (the tokenizer GGUF's ``tokenizer.chat_template``).

    Raises:
        MtpscopeError: jinja2 is missing (it comes with the ``parity`` extra) or the template fails.
    """
    try:
        import jinja2
        import jinja2.sandbox
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise MtpscopeError("rendering the chat template needs jinja2 (pip install -e '.[parity]')") from e
    try:
        return _compiled(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                          bos_token="<bos>", eos_token="<eos>")
    except jinja2.TemplateError as e:
        raise MtpscopeError(f"the chat template failed to render: {e}", key="tokenizer.chat_template") from e


def chat_text(template: str, messages: list[dict[str, str]]) -> str:
    """A conversation as the model sees it when answering its last turn: the earlier turns as the
    template renders history, the template's generation prompt, then the last answer and ``<turn|>``."""
    return render_chat(template, messages[:-1], add_generation_prompt=True) + messages[-1]["content"] + "<turn|>\n"


def chat_documents(budget: int, rng: random.Random, template: str) -> list[Document]:
    """Generated conversations (:func:`chat_text` with ``template``) until ``budget`` characters."""
    from pydoc_data.topics import topics

    tl = sorted(topics.items())
    out: list[Document] = []
    used = 0
    while used < budget:
        t = chat_text(template, chat_messages(rng, tl))
        out.append(Document("chat", f"chat:{len(out)}", t))
        used += len(t)
    return out


def build_corpus(seed: int, template: str, budget: dict[str, int] | None = None) -> list[Document]:
    """All training documents of the recipe, in a seeded order.

    Args:
        seed: the recipe's seed (each category draws from its own ``random.Random(seed, category)``).
        template: the Gemma 4 chat template (Jinja source).
        budget: characters per category (default :data:`DEFAULT_BUDGET`).
    """
    b = dict(DEFAULT_BUDGET if budget is None else budget)

    def r(cat: str) -> random.Random:
        return random.Random(f"{seed}:{cat}")

    docs = (code_documents(b.get("code", 0), r("code")) + prose_documents(b.get("prose", 0), r("prose"))
            + json_documents(b.get("json", 0), r("json")) + number_documents(b.get("numbers", 0), r("numbers"))
            + chat_documents(b.get("chat", 0), r("chat"), template))
    r("order").shuffle(docs)
    return docs


@dataclass(frozen=True)
class PromptText:
    """One demo prompt before tokenization: ``category``, ``name`` (where it came from), ``text``,
    ``special`` (tokenize with special-token parsing: the chat prompts)."""

    category: str
    name: str
    text: str
    special: bool = False


def _cut(text: str, n_chars: int, at: str) -> str:
    """``text`` up to about ``n_chars``, ending right after a character in ``at`` when one is near."""
    if len(text) <= n_chars:
        return text
    head = text[:n_chars]
    cut = max(head.rfind(c) for c in at)
    return head[: cut + 1] if cut >= n_chars // 2 else head


def demo_prompt_texts(seed: int, template: str, docs: list[Document], n_per_category: int = 6) -> list[PromptText]:
    """The demo's categorised prompts (all but ``random``, whose prompts are token ids: see
    :func:`mtpscope.demo.train.demo_prompts`).

    ``code`` / ``prose``: an excerpt of a training document starting at a ``def`` / ``class`` line or
    a paragraph; ``json`` / ``numbers`` / ``chat``: freshly generated text of the training generators,
    cut part-way (chat: every turn but the last answer, ending in the generation prompt).
    """
    rng = random.Random(f"{seed}:prompts")
    out: list[PromptText] = []
    code = [d for d in docs if d.category == "code"]
    while sum(p.category == "code" for p in out) < n_per_category:
        d = rng.choice(code)
        lines = d.text.splitlines(keepends=True)
        starts = [i for i, ln in enumerate(lines) if ln.lstrip().startswith(("def ", "class "))]
        if not starts:
            continue
        i = rng.choice(starts)
        out.append(PromptText("code", f"{d.name}:{i + 1}", _cut("".join(lines[i: i + 12]), 220, "\n")))
    prose = [d for d in docs if d.category == "prose"]
    while sum(p.category == "prose" for p in out) < n_per_category:
        d = rng.choice(prose)
        paras = [i for i, c in enumerate(d.text) if d.text.startswith("\n\n", i) and d.text[i + 2: i + 3].isalpha()]
        if not paras:
            continue
        i = rng.choice(paras) + 2
        out.append(PromptText("prose", f"{d.name}@{i}", _cut(d.text[i:], 200, " ")))
    for j in range(n_per_category):
        t = json_text(rng)
        out.append(PromptText("json", f"json:prompt:{j}", _cut(t, max(40, int(len(t) * 0.4)), "\n,")))
    for j in range(n_per_category):
        t = numbers_text(rng)
        while t.count(",") + t.count("\n") < 8:
            t = numbers_text(rng)
        out.append(PromptText("numbers", f"numbers:prompt:{j}", _cut(t, max(20, int(len(t) * 0.4)), ",\n")))
    from pydoc_data.topics import topics

    tl = sorted(topics.items())
    for j in range(n_per_category):
        msgs = chat_messages(rng, tl)
        out.append(PromptText("chat", f"chat:prompt:{j}", render_chat(template, msgs[:-1], add_generation_prompt=True),
                              special=True))
    return out


def corpus_sha256(docs: list[Document]) -> str:
    """Hex sha256 over the documents' categories, names and texts (recorded in the recipe)."""
    h = hashlib.sha256()
    for d in docs:
        for part in (d.category, d.name, d.text):
            b = part.encode("utf-8")
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
    return h.hexdigest()


def python_info() -> dict[str, str]:
    """The interpreter whose files the corpus came from (recorded in the recipe)."""
    return {"version": sys.version.split()[0], "implementation": sys.implementation.name,
            "stdlib": str(stdlib_dir())}


__all__ = ["CATEGORIES", "DEFAULT_BUDGET", "Document", "PromptText", "build_corpus", "chat_documents",
           "chat_messages", "chat_text", "demo_prompt_texts",
           "code_documents", "corpus_sha256", "json_documents", "json_text", "number_documents", "numbers_text",
           "prose_documents", "python_info", "render_chat", "stdlib_dir"]
