"""A stand-in for vLLM's interpreter in tests: it speaks `vllm_recorder.py --serve`'s protocol
(a config line, then per step the requests added and aborted, answered with the step's record)
with the simulator's own scheduler making the decisions, so a simulation driven through it must
equal the plain simulation exactly. Run as `fake_vllm.py RECORDER --serve`."""

import json
import sys

from simcore.engine.request import BlockHashSpace, Request
from simcore.engine.scheduler import Scheduler, SchedulerConfig


def main() -> None:
    assert sys.argv[1].endswith("vllm_recorder.py") and sys.argv[2:] == ["--serve"]
    cfg = json.loads(sys.stdin.readline())["config"]
    cfg["reserve_full_isl"] = cfg.pop("reserve_full_isl", True)
    sched = Scheduler(SchedulerConfig(**cfg), BlockHashSpace())
    print("vllm 0.0.0+fake", flush=True)
    reqs: dict[str, Request] = {}
    step = None
    for line in sys.stdin:
        cmd = json.loads(line)
        for r in cmd.get("add", ()):
            req = Request(r["id"], r["index"], r["prompt_len"], r["output_len"],
                          block_keys=tuple(r["block_keys"]), priority=r["priority"],
                          skip_reading_prefix_cache=r["skip_reading_prefix_cache"])
            reqs[r["id"]] = req
            sched.add_request(req)
        if cmd["op"] == "abort":
            rec = {"finished": [r.request_id for r in
                                sched.finish_requests([reqs[i] for i in cmd["abort"]])]}
        elif cmd["op"] == "schedule":
            if not sched.has_requests:
                rec = {"idle": True}
            else:
                step = sched.schedule()
                rec = {"scheduled": {r.request_id: n for r, n, _ in step.scheduled},
                       "new": [r.request_id for r in step.new],
                       "resumed": [r.request_id for r in step.resumed],
                       "preempted": [r.request_id for r in step.preempted],
                       "computed_on_admit": step.computed_on_admit}
        else:
            _, finished = sched.update(step)
            rec = {"finished": [r.request_id for r in finished]}
        rec["free_blocks"] = sched.kv.num_free_blocks
        rec["evictions"] = sched.kv.pool.num_evictions
        sys.stdout.write(json.dumps(rec) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
