"""A real WS-Discovery peer publishing an ONVIF NetworkVideoTransmitter (WSDiscovery, from
PyPI), with a device-service endpoint, for the ONVIF discovery handler's tests.

    onvif_camera.py --port 18080 --uuid <uuid> --scope onvif://www.onvif.org/name/cam1 ...
                    --ip 10.0.0.11 --mac 00:11:22:33:44:01 [--username u --password p]

WS-Discovery answers Probes for dn:NetworkVideoTransmitter on 239.255.255.250:3702 (IPv4),
as lenient as cameras are (a type whose prefix the probe does not declare, as Akri's ONVIF
handler sends `netwsdl:NetworkVideoTransmitter`, matches by its local name), with the camera's endpoint (urn:uuid:<uuid>), scopes and XAddrs
http://<host>:<port>/onvif/device_service, where <host> is the address this host sends to the
group from: the one the answer comes from, and the only one at which the handler asks a device
service (a camera's credential goes nowhere else). The device service (SOAP 1.2 over HTTP)
answers GetNetworkInterfaces (the --ip and --mac), GetCapabilities (the media service),
GetProfiles, GetStreamUri (rtsp://<ip>:554/<uuid>/main) and GetSystemDateAndTime (the time
now, in UTC: what clients ask first, to compute digests). With --username/--password every
call but GetSystemDateAndTime needs a WS-Security UsernameToken with the password digest
(base64(sha1(nonce + created + password))), as ONVIF cameras do; a wrong or missing one gets
a SOAP fault `NotAuthorized` with HTTP 400. Each request's action and whether it was
authenticated is printed ("request <action> authenticated=<bool>"). With --ignore-probes it
answers no probe (WS-Discovery off, as on many cameras): only its device service runs. Prints
"ready" once both are up; stops on SIGTERM.
"""

import argparse
import base64
import hashlib
import http.server
import re
import signal
import socket
import sys
import threading

import datetime

import wsdiscovery.publishing
import wsdiscovery.threaded
import wsdiscovery.util
from wsdiscovery import QName, Scope
from wsdiscovery.publishing import ThreadedWSPublishing

# IPv4 only: the IPv6 networking thread dies on an IPv4 reply address in some containers.
class _NoIPv6:
    def __init__(self, *args, **kwargs):
        raise OSError("IPv6 off for the test peer")

wsdiscovery.threaded.NetworkingThreadIPv6 = _NoIPv6

def _lenient_filter(services, types, scopes):
    """The library's filter, but a probed type whose prefix the probe does not declare (it
    resolves to no namespace) matches a published type of the same local name, as cameras
    match it."""

    def resolved(probed, service):
        if probed.getNamespace():
            return probed
        same = [t for t in service.getTypes() if t.getLocalname() == probed.getLocalname()]
        return same[0] if same else probed

    return [
        service
        for service in services
        if wsdiscovery.util.matchesFilter(
            service, None if types is None else [resolved(t, service) for t in types], scopes
        )
    ]


wsdiscovery.publishing.filterServices = _lenient_filter

NVT = QName("http://www.onvif.org/ver10/network/wsdl", "NetworkVideoTransmitter", "dn")


def envelope(body: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope" '
        'xmlns:tds="http://www.onvif.org/ver10/device/wsdl" '
        'xmlns:trt="http://www.onvif.org/ver10/media/wsdl" '
        'xmlns:tt="http://www.onvif.org/ver10/schema" '
        'xmlns:ter="http://www.onvif.org/ver10/error">'
        f"<s:Body>{body}</s:Body></s:Envelope>"
    ).encode()


def fault() -> bytes:
    return envelope(
        "<s:Fault><s:Code><s:Value>s:Sender</s:Value><s:Subcode><s:Value>ter:NotAuthorized"
        "</s:Value></s:Subcode></s:Code><s:Reason><s:Text xml:lang=\"en\">Sender not "
        "Authorized</s:Text></s:Reason></s:Fault>"
    )


def text_of(xml: str, name: str):
    match = re.search(rf"<(?:\w+:)?{name}\b[^>]*>([^<]*)</(?:\w+:)?{name}>", xml)
    return match.group(1) if match else None


def multicast_source() -> str:
    """The address this host sends to the WS-Discovery group from."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("239.255.255.250", 3702))
        return s.getsockname()[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--uuid", required=True)
    parser.add_argument("--scope", action="append", default=[])
    parser.add_argument("--ip", required=True)
    parser.add_argument("--mac", required=True)
    parser.add_argument("--username")
    parser.add_argument("--password")
    parser.add_argument("--ignore-probes", action="store_true")
    args = parser.parse_args()
    host = multicast_source()
    service_url = f"http://{host}:{args.port}/onvif/device_service"

    def authenticated(xml: str) -> bool:
        if not args.username:
            return True
        user = text_of(xml, "Username")
        digest = text_of(xml, "Password")
        nonce = text_of(xml, "Nonce")
        created = text_of(xml, "Created")
        if user != args.username or not digest or not nonce or not created:
            return False
        expected = base64.b64encode(
            hashlib.sha1(base64.b64decode(nonce) + created.encode() + args.password.encode()).digest()
        ).decode()
        return digest == expected

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *_):
            pass

        def do_POST(self):
            xml = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
            action = re.search(r"<(?:\w+:)?(\w+)\s*/?>\s*</(?:\w+:)?Body>|<(?:\w+:)?Body[^>]*>\s*<(?:\w+:)?(\w+)", xml)
            name = next((g for g in (action.groups() if action else ()) if g), "?")
            ok = name == "GetSystemDateAndTime" or authenticated(xml)
            print(f"request {name} authenticated={ok}", flush=True)
            if not ok:
                body, status = fault(), 400
            elif name == "GetNetworkInterfaces":
                body, status = envelope(
                    "<tds:GetNetworkInterfacesResponse><tds:NetworkInterfaces token=\"eth0\">"
                    "<tt:Enabled>true</tt:Enabled><tt:Info><tt:Name>eth0</tt:Name>"
                    f"<tt:HwAddress>{args.mac}</tt:HwAddress></tt:Info><tt:IPv4><tt:Enabled>true</tt:Enabled>"
                    f"<tt:Config><tt:Manual><tt:Address>{args.ip}</tt:Address><tt:PrefixLength>24"
                    "</tt:PrefixLength></tt:Manual><tt:DHCP>false</tt:DHCP></tt:Config></tt:IPv4>"
                    "</tds:NetworkInterfaces></tds:GetNetworkInterfacesResponse>"
                ), 200
            elif name == "GetCapabilities":
                body, status = envelope(
                    "<tds:GetCapabilitiesResponse><tds:Capabilities>"
                    f"<tt:Device><tt:XAddr>{service_url}</tt:XAddr></tt:Device>"
                    f"<tt:Media><tt:XAddr>http://{host}:{args.port}/onvif/media_service</tt:XAddr>"
                    "</tt:Media></tds:Capabilities></tds:GetCapabilitiesResponse>"
                ), 200
            elif name == "GetProfiles":
                body, status = envelope(
                    "<trt:GetProfilesResponse><trt:Profiles token=\"main\" fixed=\"true\">"
                    "<tt:Name>main</tt:Name></trt:Profiles><trt:Profiles token=\"sub\">"
                    "<tt:Name>sub</tt:Name></trt:Profiles></trt:GetProfilesResponse>"
                ), 200
            elif name == "GetSystemDateAndTime":
                now = datetime.datetime.now(datetime.timezone.utc)
                body, status = envelope(
                    "<tds:GetSystemDateAndTimeResponse><tds:SystemDateAndTime>"
                    "<tt:DateTimeType>NTP</tt:DateTimeType><tt:DaylightSavings>false</tt:DaylightSavings>"
                    f"<tt:UTCDateTime><tt:Time><tt:Hour>{now.hour}</tt:Hour><tt:Minute>{now.minute}"
                    f"</tt:Minute><tt:Second>{now.second}</tt:Second></tt:Time><tt:Date><tt:Year>"
                    f"{now.year}</tt:Year><tt:Month>{now.month}</tt:Month><tt:Day>{now.day}</tt:Day>"
                    "</tt:Date></tt:UTCDateTime></tds:SystemDateAndTime></tds:GetSystemDateAndTimeResponse>"
                ), 200
            elif name == "GetStreamUri":
                token = text_of(xml, "ProfileToken") or "main"
                body, status = envelope(
                    "<trt:GetStreamUriResponse><trt:MediaUri>"
                    f"<tt:Uri>rtsp://{args.ip}:554/{args.uuid}/{token}</tt:Uri>"
                    "<tt:InvalidAfterConnect>false</tt:InvalidAfterConnect></trt:MediaUri>"
                    "</trt:GetStreamUriResponse>"
                ), 200
            else:
                body, status = fault(), 400
            self.send_response(status)
            self.send_header("Content-Type", "application/soap+xml; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer((host, args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    publishing = None
    if not args.ignore_probes:
        publishing = ThreadedWSPublishing(uuid_=f"urn:uuid:{args.uuid}")
        publishing.start()
        publishing.publishService(
            types=[NVT],
            scopes=[Scope(s) for s in args.scope],
            xAddrs=[service_url],
        )
    print("ready", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    if publishing:
        publishing.stop()
    server.shutdown()


if __name__ == "__main__":
    main()
