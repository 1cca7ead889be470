"""Remote GGUF inventory over HTTP range requests: requests and bytes against the header size (the baseline).

A real HTTP server on 127.0.0.1 (tests/remote_server.py) serves (1) a sparse gemma4-like GGUF of more
than 10 GB with a small header (2 metadata keys, 522 tensors; bench_header.py's "metadata: 2 keys"
case), (2) the same tensors under the real Gemma 4 tokenizer's 15.8 MB of metadata (what every Gemma 4
GGUF carries), and (3) the real tokenizer GGUF itself. For each: requests sent and body bytes the server
wrote for ``open_remote`` + ``build_inventory``, against the header size; with and without the cached
tokenizer as a layout hint. Targets (issue 16): <= 3 requests and <= header + 1 MiB.

Run: ``.venv/bin/python -m benchmarks.bench_remote``. Prints numbers; asserts nothing.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from mtpscope.inspector.gguf import open_gguf
from mtpscope.inspector.inventory import build_inventory
from mtpscope.inspector.remote import RemoteOptions, open_remote
from tests.remote_server import FileServer, write_sparse_gguf

MiB = 1 << 20


def main() -> None:
    from mtpscope.cache import vocab_path

    vocab = vocab_path()
    with tempfile.TemporaryDirectory() as tmp:
        sparse = Path(tmp) / "sparse.gguf"
        tok = Path(tmp) / "sparse-tokenizer.gguf"
        write_sparse_gguf(sparse, n_layers=40)
        write_sparse_gguf(tok, n_layers=40, kv_from=vocab)
        files = {"sparse.gguf": sparse, "sparse-tokenizer.gguf": tok, "vocab.gguf": vocab}
        with FileServer(files) as srv:
            print(f"{'file':<24} {'size':>10} {'header':>12} {'hint':>5} | {'requests':>8} {'bytes':>12} "
                  f"{'over header':>12} {'ms':>7} | target <= 3 requests, <= header + 1 MiB")
            for name, path in files.items():
                local = open_gguf(path)
                for hint in (False, True):
                    srv.reset()
                    opts = RemoteOptions(token="", layout_hints=(str(vocab),) if hint else ())
                    t0 = time.perf_counter()
                    f = open_remote(srv.url("range", name), opts)
                    inv = build_inventory(f)
                    ms = (time.perf_counter() - t0) * 1000
                    hits = srv.hits
                    sent = sum(h.sent for h in hits)
                    if inv.n_tensors != len(local.tensors) or f.tensors != local.tensors:
                        raise SystemExit(f"{name}: remote inventory differs from the local one")
                    ok = len(hits) <= 3 and sent <= local.header_end + MiB
                    print(f"{name:<24} {local.file_size / 1e9:>8.2f}GB {local.header_end:>12,} {'yes' if hint else 'no':>5} | "
                          f"{len(hits):>8} {sent:>12,} {sent - local.header_end:>+12,} {ms:>7.0f} | "
                          f"{'met' if ok else 'NOT met'}")
                    f.close()


if __name__ == "__main__":
    main()
