"""Records tests/data/run_trace.jsonl and tests/data/run_logits.npz: the events the engine
gives for each of tests/run_scenarios.py's scenarios on the real default model (1 llama
thread, n_ctx 512), and the logits row behind each draw of the scenario replayed without a model, with the pieces of every token
the events name (what a model-free host needs to replay the rows).

    .venv/bin/python tests/data/record_run_trace.py [OUT_DIR]   (default: tests/data)

Recorded on the engine as it was before the reply run became an object (commit e1b2a7e),
so tests/test_run_trace.py checks that the refactored engine gives the very same events. To record
again on another llama-cpp-python build (as for issue 25's patch), run this file as it was at
commit 1c62737 with that commit's src first on PYTHONPATH (`git archive 1c62737 src tests`), and
copy the two files here: the old engine's events, not the current one's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from run_scenarios import REPLAYED, SCENARIOS, play  # noqa: E402

from loopchat.engine.engine import Engine  # noqa: E402
from loopchat.event_json import to_json_dict  # noqa: E402
from loopchat.events import Pending, Start, Step  # noqa: E402
from loopchat.model_files import builtin_model_path  # noqa: E402


def main() -> None:
    engine = Engine(builtin_model_path(), n_ctx=512, threads=1, log_path=Path("/tmp/record-llama.log"))
    rows: dict[str, list[np.ndarray]] = {}
    lines: list[str] = []
    ids: set[int] = set()
    real_logits = engine._logits
    for s in SCENARIOS:
        taken = rows.setdefault(s.name, [])

        def logits(taken: list = taken) -> np.ndarray:
            row = real_logits()
            taken.append(row.copy())
            return row

        # the old engine read its logits through _logits, the run reads them through logits
        engine._logits = engine.logits = logits  # type: ignore[method-assign]
        events = play(lambda r, live, control: engine.run_reply(r, live=live, control=control), s)
        for e in events:
            lines.append(json.dumps({"scenario": s.name, **to_json_dict(e)}))
            if s.name != REPLAYED:
                continue
            if isinstance(e, Start):
                ids.update(e.prompt_token_ids)
            if isinstance(e, (Step, Pending)):
                ids.update(c.token_id for c in e.raw_top + e.sampled_top)
            if isinstance(e, Step):
                ids.add(e.token_id)
    ids.update(range(10))
    ordered = sorted(ids)
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    (out / "run_trace.jsonl").write_text("\n".join(lines) + "\n")
    np.savez_compressed(
        out / "run_logits.npz",
        rows=np.stack(rows[REPLAYED]),
        piece_ids=np.array(ordered, dtype=np.int64),
        pieces=np.array([engine.piece(i).hex() for i in ordered]),
        eog=np.array([engine.is_eog(i) for i in ordered]),
    )
    engine.close()


if __name__ == "__main__":
    main()
