"""Task 3: The KV Cache Problem - why memory matters.

Contiguous allocation reserves the worst case, --max-len token slots, for every request,
because nobody knows in advance how long an answer will be. This script simulates five
requests of the source (45, 128, 23, 256 and 67 tokens) against 512-slot reservations and prints
how much of the reservation each one wastes, the memory utilisation, how many users fit in
10,000 slots, and what those slots are in bytes for the model the lab runs.

    python task_3_kv_cache_problem.py [--lengths 45,128,23,256,67] [--max-len 512]
                                      [--total-slots 10000] [--model M] [--dtype auto]
"""
from __future__ import annotations

from common import cli, figures, kv, results, settings
from lessons.task_3 import FIGURES
from lessons.task_3.record import ContiguousKV, ContiguousRequest
from lessons.task_3.report import print_report

SCRIPT = "task_3_kv_cache_problem"


def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    cli.add_kv_simulation_args(parser)
    cli.add_model_args(parser)
    args = parser.parse_args(argv)
    args.names = cli.check_kv_simulation_args(parser, args)
    return args


def main(argv: list[str] | None = None) -> ContiguousKV:
    args = parse_args(argv)
    model = cli.resolve_model_or_fail(args.model)
    dtype = settings.resolve_dtype(args.dtype)

    contiguous = kv.allocate_contiguous(args.lengths, args.max_len)
    # Users that fit: contiguous reserves max_len each; with no waste, each user needs only the
    # mean of what the requests really use, in whole slots (519 // 5 = 103 for the source's five).
    mean_used = kv.mean_slots(contiguous.num_used, len(args.lengths))
    users_contiguous = kv.users_that_fit(args.total_slots, args.max_len)
    users_ideal = kv.users_that_fit(args.total_slots, mean_used)
    in_bytes = kv.kv_bytes(
        kv.ModelKV.from_folder(model.path, dtype.dtype), settings.KV_CACHE_BYTES,
        settings.BLOCK_SIZE, settings.MAX_MODEL_LEN,
        slots=[("Allocated", contiguous.num_allocated), ("Used", contiguous.num_used),
               ("Wasted", contiguous.num_allocated - contiguous.num_used)],
        users=[(f"Contiguous ({args.max_len} each)", args.max_len),
               (f"Ideal ({mean_used} each)", mean_used)])

    print_report(args, model, contiguous, mean_used, users_contiguous, users_ideal, in_bytes)

    record = ContiguousKV(
        kv.Simulation(args.lengths, args.max_len, args.total_slots),
        [ContiguousRequest(n, a.num_used, a.num_allocated, round(a.waste_pct, 1))
         for n, a in zip(args.names, contiguous.allocations)],
        contiguous.num_allocated, contiguous.num_used, round(contiguous.utilization_pct, 1),
        round(contiguous.waste_pct, 1), mean_used, users_contiguous, users_ideal,
        in_bytes.saved(), header=results.RunHeader.of(model, dtype))
    figures.saved(results.save(SCRIPT, record), record, FIGURES)
    return record


if __name__ == "__main__":
    cli.run(main)
