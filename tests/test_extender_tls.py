"""kube-scheduler to the extender over TLS with client certificates, exactly as ``docs/scheduling.md`` shows.

The two snippets of the doc (the extender's web config, kube-scheduler's ``extenders:`` entry) are read from
the doc; certificates are made here with ``openssl`` (``test_tls.issue``): a CA for the extender's serving
certificate, one for kube-scheduler's client certificate, and a stranger's. The extender is ``serve`` on
loopback; the client does what kube-scheduler does with its ``tlsConfig``.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from fixture_files import filter_request
from test_extender import KNOWN, NODES, agents, fixture_nodes  # noqa: F401 (agents is a fixture)
from test_extender_deploy import EXTENDER_FIELDS
from test_tls import issue

from gpuagent.api.tls import load_web_config, server_ssl_context
from gpuagent.hints.agents import AgentCache, AgentDirectory
from gpuagent.hints.extender import Extender
from gpuagent.hints.extender_serve import serve

DOC = Path(__file__).resolve().parents[1] / "docs" / "scheduling.md"
TLS_CONFIG_FIELDS = {"insecure", "serverName", "certFile", "keyFile", "caFile", "certData", "keyData", "caData"}


def doc_snippets() -> tuple[dict[str, Any], dict[str, Any]]:
    """(the web config, the KubeSchedulerConfiguration) of the doc's TLS section."""
    section = DOC.read_text().split("### TLS between kube-scheduler and the extender", 1)[1]
    blocks = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", section, re.S)]
    web = next(b for b in blocks if "tls_server_config" in b)
    scheduler = next(b for b in blocks if b.get("kind") == "KubeSchedulerConfiguration")
    return web, scheduler


def test_the_docs_entry_is_kube_schedulers() -> None:
    _, scheduler = doc_snippets()
    (entry,) = scheduler["extenders"]
    assert set(entry) <= EXTENDER_FIELDS and set(entry["tlsConfig"]) <= TLS_CONFIG_FIELDS
    assert entry["enableHTTPS"] is True and entry["urlPrefix"].startswith("https://")


async def test_kube_scheduler_with_its_client_certificate_and_nobody_else(
    tmp_path: Path, agents: Any  # noqa: F811
) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make certificates with")
    web, scheduler = doc_snippets()
    tls = scheduler["extenders"][0]["tlsConfig"]
    extender_ca, scheduler_ca, stranger_ca = (issue(tmp_path, name) for name in ("extender-ca", "scheduler-ca",
                                                                                "stranger-ca"))
    serving = issue(tmp_path, "tls", extender_ca, server=True)  # SANs 127.0.0.1, localhost
    client, stranger = issue(tmp_path, "scheduler", scheduler_ca), issue(tmp_path, "stranger", stranger_ca)
    # the extender's files, named as in the doc's web config, beside it
    files = {"cert_file": serving.cert, "key_file": serving.key, "client_ca_file": scheduler_ca.cert}
    server_dir = tmp_path / "extender"
    server_dir.mkdir()
    for key, source in files.items():
        shutil.copy(source, server_dir / web["tls_server_config"][key])
    (server_dir / "web.yml").write_text(yaml.safe_dump(web))
    context = server_ssl_context(load_web_config(str(server_dir / "web.yml")))

    fixture_nodes(agents)
    cache = AgentCache(AgentDirectory(template=agents.base_url + "/n/{node}"), known=KNOWN)
    stop = asyncio.Event()
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    serving_task = asyncio.create_task(serve(Extender(cache), host="127.0.0.1", port=0, prefix="/gpuagent",
                                             ssl_context=context, stop=stop, started=bound.set_result))

    def scheduler_context(certificate: Any | None) -> ssl.SSLContext:
        """What kube-scheduler builds from tlsConfig: caFile pins the extender's CA, certFile/keyFile."""
        made = ssl.create_default_context(cafile=str(extender_ca.cert))
        if certificate is not None:
            made.load_cert_chain(certificate.cert, certificate.key)
        return made

    try:
        port = await asyncio.wait_for(bound, 10)
        base = f"https://127.0.0.1:{port}/gpuagent"
        assert tls["caFile"] and tls["certFile"] and tls["keyFile"]  # the doc sets all three
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{base}/filter", json=filter_request(), ssl=scheduler_context(client)) as r:
                assert r.status == 200 and (await r.json())["NodeNames"] == [NODES[0]]
            async with session.post(f"{base}/prioritize", json=filter_request(), ssl=scheduler_context(None)) as r:
                reply = await r.json()
                assert r.status == 403 and reply["field"] == "certificate", reply
            async with session.get(f"https://127.0.0.1:{port}/healthz", ssl=scheduler_context(None)) as r:
                assert r.status == 200  # the kubelet's probe needs no certificate
            with pytest.raises(aiohttp.ClientError):  # another CA's certificate: refused in the handshake
                async with session.post(f"{base}/filter", json=filter_request(),
                                        ssl=scheduler_context(stranger)) as r:
                    await r.read()
    finally:
        stop.set()
        await asyncio.wait_for(serving_task, 10)
