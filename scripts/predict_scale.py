"""What the cost model predicts for allreduce on more hosts than this machine can emulate: by formula only.

For N hosts of k ranks each (consecutive ranks per host, a torus of k x N), every algorithm of the registry
at each size, from a tuning profile (``--profile``, made by ``commlib-bench --calibrate``) or the defaults.
These are predictions, not measurements.

    python scripts/predict_scale.py --profile tuning.json --hosts 2,16,64,256 --per-host 2 --sizes 4K,1M,64M
"""

import argparse

from commlib.algorithms import cost, select, spec
from commlib.compression import Compression
from commlib.config import parse_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", help="tuning profile (default: the model's defaults)")
    parser.add_argument("--hosts", default="2,16,64,256")
    parser.add_argument("--per-host", type=int, default=2)
    parser.add_argument("--sizes", default="4K,1M,64M")
    parser.add_argument("--compression", choices=("none", "fp16", "bf16"), default="none")
    parser.add_argument("--link-rate", type=float, default=None, metavar="BYTES_PER_S",
                        help="also print the link bound (default: 1/beta of the model's inter link)")
    args = parser.parse_args()

    model = cost.DEFAULTS
    if args.profile:
        model = cost.model_from_profile(cost.read_profile(args.profile), args.profile)
    codec = getattr(Compression, args.compression) if args.compression != "none" else None
    rate = args.link_rate or 1 / model.inter.beta_s_per_byte
    names = [s.name for s in spec.SPECS if s.name != "cma"]
    print(f"# predicted allreduce time (ms) by the cost model ({model.source}); compression {args.compression}")
    print(f"# {'hosts':>5} {'size':>6} " + " ".join(f"{n[:12]:>12}" for n in names)
          + f" {'auto picks':>14} {'x bound':>8}")
    for hosts in (int(h) for h in args.hosts.split(",")):
        shape = cost.Shape.blocks(hosts, args.per_host)
        for size_text in args.sizes.split(","):
            nbytes = parse_size(size_text)
            ranked = select.rank_all(model, nbytes, shape, [spec.get(n) for n in names], codec, 1 << 20)
            by_name = {c.algorithm: c.predicted_s for c in ranked}
            best = next(c for c in ranked if c.algorithm != "native" or codec is None)
            bound = cost.link_bound(nbytes, hosts, rate, codec)
            print(f"  {hosts:>5} {size_text:>6} " + " ".join(
                f"{by_name[n] * 1e3:>12.3f}" if by_name[n] != cost.INF else f"{'-':>12}" for n in names)
                + f" {best.algorithm[:14]:>14} {best.predicted_s / bound if bound else 0:>8.2f}")


if __name__ == "__main__":
    main()
