#!/usr/bin/env python3
"""Opens many connections to a fanline server, each sending one request, then closes them.

Used by scripts/measure-memory for the server's memory after a flood of connections. By
default every connection is held open until all of them have been answered (the worst case
for the server: all their buffers at once), then all are closed; with --no-hold each closes
as soon as it is answered. Loopback only, bounded in count and time.

    scripts/measure-memory-connections.py --port 8080 --count 10000
"""

import argparse
import asyncio
import resource
import sys
import time

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


class Flood:
    def __init__(self, args):
        self.args = args
        self.opened = 0
        self.answered = 0
        self.failed = 0
        self.finished = asyncio.Event()
        # Connections being opened and answered at once; a held one gives its slot back.
        self.slots = asyncio.Semaphore(args.connecting)

    def settle(self):
        if self.answered + self.failed >= self.args.count:
            self.finished.set()

    async def connection(self):
        args = self.args
        writer = None
        try:
            async with self.slots:
                try:
                    reader, writer = await asyncio.wait_for(
                        asyncio.open_connection(args.host, args.port), args.timeout)
                    self.opened += 1
                    writer.write(REQUEST)
                    await writer.drain()
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), args.timeout)
                    length = 0
                    for line in head.split(b"\r\n"):
                        if line.lower().startswith(b"content-length:"):
                            length = int(line.split(b":", 1)[1])
                    if length:
                        await asyncio.wait_for(reader.readexactly(length), args.timeout)
                    self.answered += 1
                except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
                    self.failed += 1
                    return
                finally:
                    self.settle()
            if args.hold:
                await self.finished.wait()
        finally:
            if writer is not None:
                writer.close()


async def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--connecting", type=int, default=500,
                        help="connections being opened at once (default 500)")
    parser.add_argument("--no-hold", dest="hold", action="store_false",
                        help="close each connection as soon as it is answered")
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="seconds each step of a connection may take (default 10)")
    args = parser.parse_args()
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("loopback only")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if args.hold and args.count + 100 > hard:
        print(f"note: {args.count} held connections need more than the open-file limit "
              f"{hard}; some will fail", file=sys.stderr)

    flood = Flood(args)
    flood.settle()
    began = time.monotonic()
    tasks = [asyncio.ensure_future(flood.connection()) for _ in range(args.count)]
    try:
        await asyncio.wait_for(flood.finished.wait(), 300)
    except asyncio.TimeoutError:
        print("gave up waiting after 300 s", file=sys.stderr)
    held = flood.answered if args.hold else 0
    flood.finished.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    print(f"connections: {args.count} asked, {flood.opened} opened, {flood.answered} answered, "
          f"{flood.failed} failed, {held} held open at once, closed after "
          f"{time.monotonic() - began:.1f} s")


if __name__ == "__main__":
    asyncio.run(main())
