"""A real OPC UA server (asyncua, from PyPI) for the OPC UA discovery handler's tests.

    opcua_server.py --port 4841 --name Boiler [--type server|discovery] [--register-to opc.tcp://127.0.0.1:4840/] [--host 127.0.0.1]

Serves on opc.tcp://<host>:<port>/ (host: 127.0.0.1 unless given; an address pods on real
test nodes reach, for them) with the given application name and type (a plain
server is ClientAndServer, asyncua's default; `server` makes it Server; `discovery` makes it a
discovery server, which also answers FindServers with the servers registered to it), and
registers with the discovery server at --register-to (every 2 s). Prints "ready" once
serving; stops on SIGTERM.
"""

import argparse
import asyncio
import logging
import signal

from asyncua import Server, ua


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--type", choices=["client-and-server", "server", "discovery"], default="client-and-server")
    parser.add_argument("--register-to")
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    server = Server()
    await server.init()
    server.set_endpoint(f"opc.tcp://{args.host}:{args.port}/")
    server.set_server_name(args.name)
    await server.set_application_uri(f"urn:akri-test:{args.name}")
    server.application_type = {
        "client-and-server": ua.ApplicationType.ClientAndServer,
        "server": ua.ApplicationType.Server,
        "discovery": ua.ApplicationType.DiscoveryServer,
    }[args.type]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    async with server:
        if args.register_to:
            await server.register_to_discovery(args.register_to, period=2)
        print("ready", flush=True)
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
