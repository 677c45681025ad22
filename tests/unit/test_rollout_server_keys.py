"""The rollout-server keys of the config: the API key is taken from the config or the
environment and never written or printed; a non-loopback host in the servers' extra
arguments is refused unless the user opts in; the factory makes a new key per run for the
servers it starts."""

from __future__ import annotations

import pytest

from areal_m2po.api.cli_args import SERVER_API_KEY_ENV, ConfigError, RolloutConfig, VLLMConfig
from areal_m2po.api.config_loader import config_to_yaml, load_config, save_config
from areal_m2po.rollout.common.guard import API_KEY_ENV, bearer_matches, below_root
from areal_m2po.rollout.factory import server_api_key

SECRET = "s3cret-key-never-shown"


def test_the_key_is_never_written_or_printed(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(SERVER_API_KEY_ENV, raising=False)
    cfg = load_config([f"rollout.server_api_key={SECRET}"])
    assert cfg.rollout.api_key() == SECRET
    text = config_to_yaml(cfg)
    assert SECRET not in text and "server_api_key: null" in text
    assert SECRET not in repr(cfg) and SECRET not in repr(cfg.rollout)
    saved = save_config(cfg, tmp_path / "config.yaml").read_text()
    assert SECRET not in saved
    assert load_config(["--config", str(tmp_path / "config.yaml")]).rollout.api_key() is None


def test_the_key_comes_from_the_environment_when_the_config_has_none(monkeypatch) -> None:
    assert SERVER_API_KEY_ENV == API_KEY_ENV  # one name, trainer and servers
    monkeypatch.setenv(SERVER_API_KEY_ENV, SECRET)
    cfg = load_config([])
    assert cfg.rollout.server_api_key is None and cfg.rollout.api_key() == SECRET
    assert load_config(["rollout.server_api_key=other"]).rollout.api_key() == "other"


def test_a_bad_key_is_refused_without_echoing_it() -> None:
    with pytest.raises(ConfigError) as caught:
        RolloutConfig(server_api_key="two words\n")
    assert str(caught.value) == "server_api_key: must be a non-empty printable string or null"


def test_servers_started_here_get_a_new_key_per_run(monkeypatch) -> None:
    monkeypatch.delenv(SERVER_API_KEY_ENV, raising=False)
    cfg = load_config([])
    first, second = server_api_key(cfg, starts_servers=True), server_api_key(cfg, True)
    assert first and second and first != second and len(first) >= 40
    assert server_api_key(cfg, starts_servers=False) is None  # servers elsewhere, no key given
    given = load_config([f"rollout.server_api_key={SECRET}"])
    assert server_api_key(given, starts_servers=True) == SECRET


@pytest.mark.parametrize(
    "args, refused",
    [
        (["--host", "0.0.0.0"], "0.0.0.0"),
        (["--tensor-parallel-size", "2", "--host=10.1.2.3"], "10.1.2.3"),
        (["--host", "::"], "::"),
        (["--host", "127.0.0.2"], None),
        (["--host", "localhost"], None),
        (["--host", "::1"], None),
        (["--port", "9"], None),
    ],
)
def test_a_public_host_in_the_servers_arguments_needs_the_opt_in(args, refused) -> None:
    vllm = VLLMConfig(server_args=args)
    if refused is None:
        RolloutConfig(vllm=vllm)
        return
    with pytest.raises(ConfigError) as caught:
        RolloutConfig(vllm=vllm)
    assert str(caught.value).startswith(f"vllm.server_args: --host {refused} is not a loopback")
    assert "rollout.allow_public_host: true" in str(caught.value)
    RolloutConfig(vllm=vllm, allow_public_host=True)


def test_the_command_line_names_the_public_host_key() -> None:
    with pytest.raises(ConfigError, match=r"rollout\.vllm\.server_args: --host 0\.0\.0\.0"):
        load_config(["rollout.vllm.server_args=[--host, 0.0.0.0]"])


def test_bearer_and_root_checks(tmp_path) -> None:
    assert bearer_matches("Bearer abc", "abc") and bearer_matches("bearer abc", "abc")
    for header in (None, "", "abc", "Bearer abd", "Basic abc", "Bearer"):
        assert not bearer_matches(header, "abc")
    root = tmp_path / "root"
    (root / "v1").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    (root / "link").symlink_to(tmp_path / "out")
    assert below_root(str(root / "v1"), str(root)) and below_root(str(root), str(root))
    assert not below_root(str(root / "link"), str(root))
    assert not below_root(str(root / ".." / "out"), str(root))
    assert not below_root(str(tmp_path / "root2"), str(root))  # a sibling with a longer name


def test_the_scaling_recipes_bind_a_public_host_only_with_a_key() -> None:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "scaling.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    public = [b for b in blocks if "--host 0.0.0.0" in b]
    assert public  # the SGLang recipe
    for block in public:
        assert "--api-key" in block, block
    for block in blocks:
        if "rollout_server " in block or "vllm_server_main" in block:
            assert "AREAL_M2PO_SERVER_API_KEY" in block and "--weights-root" in block, block


@pytest.mark.parametrize("args", [["--api-key", SECRET], [f"--api-key={SECRET}"]])
def test_an_api_key_among_the_vllm_server_args_is_refused(args) -> None:
    with pytest.raises(ConfigError) as caught:
        RolloutConfig(vllm=VLLMConfig(server_args=["--dtype", "float32", *args]))
    assert str(caught.value).startswith("vllm.server_args: --api-key: the servers started here")
    assert SECRET not in str(caught.value)


def test_the_vllm_server_entry_wants_the_key_before_the_separator(capsys) -> None:
    from areal_m2po.rollout.servers.vllm_main import main

    with pytest.raises(SystemExit) as caught:
        main(["--parent-pid", "1", "--", "--model", "m", "--api-key", "k"])
    assert caught.value.code == 2
    assert "give --api-key before '--'" in capsys.readouterr().err


def _asgi_call(guard, scope):
    """Run ``guard`` on one connection; the messages it sent and whether the app ran."""
    import asyncio

    sent: list[dict] = []
    reached: list[str] = []

    async def app(scope, receive, send):
        reached.append(scope["path"])

    guard.app = app

    async def receive():
        return {"type": "websocket.connect"}

    async def send(message):
        sent.append(message)

    asyncio.run(guard(scope, receive, send))
    return sent, reached


@pytest.mark.parametrize(
    "headers, allowed",
    [
        ([], False),
        ([(b"authorization", b"Bearer wrong")], False),
        ([(b"authorization", b"Bearer k")], True),
    ],
)
def test_a_websocket_without_the_key_is_closed_before_it_reaches_the_server(
    headers, allowed
) -> None:
    from areal_m2po.rollout.common.guard import ServerGuard

    scope = {"type": "websocket", "path": "/v1/realtime", "headers": headers}
    sent, reached = _asgi_call(ServerGuard(None, api_key="k"), scope)
    if allowed:
        assert reached == ["/v1/realtime"] and sent == []
    else:
        assert reached == [] and sent == [{"type": "websocket.close", "code": 1008}]
