#!/usr/bin/env python3
"""Submits messages to a distillation deployment as one of its generated clients, on
asyncio, and prints the height each was delivered at (as `phalanxd client submit`).

    phalanxd keygen --protocol distill --dir dcluster --clients 1000 --brokers 2 --insecure-test-crypto
    for i in 0 1 2 3; do phalanxd run --config dcluster/cluster.toml --id $i & done
    for b in 1000 1001; do phalanxd broker --config dcluster/cluster.toml --id $b & done
    python examples/python/distill_submit.py dcluster/cluster.toml hello world

Messages go one after the other, each through a broker over UDP (the client resubmits
through the next broker if one goes quiet); a delivery is certified by the servers.
`--index N` picks client N of the directory (default 0).
"""

import argparse
import asyncio
import sys

import phalanx


async def main(config: str, index: int, messages: list) -> None:
    async with phalanx.DistillClient.from_cluster_file(config, index, timeout=10) as client:
        print(f"client {client.index} (node {client.id}) of {config}")
        for message in messages:
            delivery = await client.submit(message)
            print(f"{message!r}: delivered at height {delivery.height} (seq {delivery.seq})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="the deployment's cluster.toml")
    parser.add_argument("messages", nargs="+")
    parser.add_argument("--index", type=int, default=0, help="the client's index in the generated directory")
    args = parser.parse_args()
    try:
        asyncio.run(main(args.config, args.index, args.messages))
    except phalanx.TimeoutError as e:
        sys.exit(f"error: {e}")
    except phalanx.ConfigError as e:
        sys.exit(f"error: {e}")
