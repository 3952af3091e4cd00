"""Read ``SHARD_FRAMES`` straight from one node's JetStream store (nats-server's file store: each
record is length, sequence, timestamp, subject, headers, data, hash) and print where a shard's
frames break their order, with the messages around the break. A clustered R3 stream cannot be
opened by a standalone server ("replicas > 1 not supported in non-clustered mode"), hence this.

    python read_blocks.py <tmp_path>/nats-2/jetstream [first-seq-base]
"""

from __future__ import annotations

import json
import struct
import sys
from itertools import pairwise
from pathlib import Path

HEADERS_BIT, DELETED_BIT = 1 << 31, 1 << 63


def records(store: Path) -> list[tuple[int, int, str, bytes]]:
    """(stream seq, timestamp ns, subject, data) of every message, in stream order."""
    found = []
    blocks = sorted((store / "jetstream" / "$G" / "streams" / "SHARD_FRAMES" / "msgs").glob("*.blk"),
                    key=lambda p: int(p.stem))
    for block in blocks:
        raw, at = block.read_bytes(), 0
        while at + 22 <= len(raw):
            length, seq, ts, subject_len = struct.unpack_from("<IQqH", raw, at)
            has_headers, length = length & HEADERS_BIT, length & ~HEADERS_BIT
            if length == 0:
                break
            subject = raw[at + 22:at + 22 + subject_len].decode(errors="replace")
            data_at = at + 22 + subject_len
            if has_headers:
                (headers_len,) = struct.unpack_from("<I", raw, data_at)
                data_at += 4 + headers_len
            found.append((seq & ~DELETED_BIT, ts, subject, raw[data_at:at + length - 8]))
            at += length
    return found


def main(store: Path) -> None:
    messages = records(store)
    first: dict[str, int] = {}
    frames: dict[str, list[tuple[int, int]]] = {}
    for seq, _ts, subject, data in messages:
        number = json.loads(data).get("seq") if ".frame." in subject else None
        if not isinstance(number, int):
            continue  # not a numbered frame
        shard = subject.split(".")[1]
        first.setdefault(shard, number)
        frames.setdefault(shard, []).append((seq, number - first[shard]))
    t0 = messages[0][1] if messages else 0
    print(f"{len(messages)} messages; frames numbered from each shard's first (#0); t from the first message")
    for shard, got in sorted(frames.items()):
        for (seq_a, a), (seq_b, b) in pairwise(got):
            if b <= a:
                print(f"{shard}: frame #{b} (stream seq {seq_b}) stored after #{a} (stream seq {seq_a})")
        runs: list[list[tuple[int, int]]] = []
        for seq, n in got:
            if runs and n == runs[-1][-1][1] + 1:
                runs[-1].append((seq, n))
            else:
                runs.append([(seq, n)])
        print(f"{shard}: {len(got)} frames, {len({n for _, n in got})} distinct, stored as runs: "
              + ", ".join(f"#{r[0][1]}..#{r[-1][1]} at {r[0][0]}..{r[-1][0]}" for r in runs))
    for seq, ts, subject, data in messages:
        if any(lo <= seq <= hi for lo, hi in ((2213, 2218), (2244, 2247), (2505, 2524))):
            shard = subject.split(".")[1]
            number = json.loads(data).get("seq") if ".frame." in subject else None
            shown = f"#{number - first[shard]}" if isinstance(number, int) else subject
            print(f"  {seq}  t={(ts - t0) / 1e9:7.3f} s  {shard} {shown}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
