"""craned's configuration: the lifetimes of entries for sessions that left (TOML and flags)."""

from __future__ import annotations

from pathlib import Path

import pytest

from crane.craned.config import DaemonConfig, load_config
from crane.craned.main import parse_args


def test_defaults_keep_redirects_ten_minutes_and_parked_sessions_an_hour() -> None:
    cfg = DaemonConfig()
    assert cfg.moved_ttl_s == 600 and cfg.parked_ttl_s == 3600


def test_file_then_flags(tmp_path: Path) -> None:
    f = tmp_path / "craned.toml"
    f.write_text("moved_ttl_s = 30\nparked_ttl_s = 0\n")
    cfg = load_config(f, {})
    assert cfg.moved_ttl_s == 30.0 and cfg.parked_ttl_s == 0.0  # 0: until restored
    args = parse_args(["--parked-ttl", "86400", "--moved-ttl", "1.5"])
    cfg = load_config(f, {"moved_ttl_s": args.moved_ttl, "parked_ttl_s": args.parked_ttl})
    assert cfg.moved_ttl_s == 1.5 and cfg.parked_ttl_s == 86400.0
    assert parse_args([]).parked_ttl is None  # no flag: the file's (or default) value stands


@pytest.mark.parametrize("bad", ["-1", '"ten minutes"', "true", "nan"])
def test_bad_lifetimes_are_refused_by_name(tmp_path: Path, bad: str) -> None:
    f = tmp_path / "craned.toml"
    f.write_text(f"parked_ttl_s = {bad}\n")
    with pytest.raises(ValueError, match="parked_ttl_s must be a number of seconds >= 0"):
        load_config(f, {})


def test_tenants_are_read_with_their_quotas(tmp_path: Path) -> None:
    f = tmp_path / "craned.toml"
    f.write_text(
        'peers = "craned-b"\n'
        "[tenants.alice]\nuids = [1001]\ncerts = ['alice']\nmemory = '16GiB'\n"
        "max_sessions = 4\nkernel_time_limit_s = 30\n"
        "[tenants.ops]\ngids = [0]\noperator = true\n"
    )
    cfg = load_config(f, {})
    alice, ops = cfg.tenants["alice"], cfg.tenants["ops"]
    assert (alice.uids, alice.certs, alice.memory) == ([1001], ["alice"], 16 << 30)
    assert (alice.max_sessions, alice.kernel_time_limit_s, alice.operator) == (4, 30.0, False)
    assert ops.operator and ops.gids == [0] and ops.memory is None
    assert cfg.peers == ["craned-b"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[tenants.a]\nmemroy = '1GiB'\n", r"\[tenants.a\]: unknown keys \['memroy'\]"),
        ("[tenants.a]\nmemory = 'lots'\n", "not a size: 'lots'"),
        ("[tenants.a]\nuids = [-1]\n", "uids must be a list of ids"),
        ("[tenants.a]\noperator = 'yes'\n", "operator must be true or false"),
        ("[tenants.a]\nkernel_time_limit_s = 0\n", "kernel_time_limit_s must be seconds > 0"),
    ],
)
def test_bad_tenant_tables_are_refused_by_name(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "craned.toml"
    f.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_config(f, {})


@pytest.mark.parametrize(
    ("text", "n"), [("512MiB", 512 << 20), ("40GB", 40 * 10**9), ("2 G", 2 << 30), (7, 7)]
)
def test_sizes(text: object, n: int) -> None:
    from crane.daemon.tenants import parse_size

    assert parse_size(text) == n


def test_tcp_listeners_need_mutual_tls_or_insecure_tcp(tmp_path: Path) -> None:
    tcp = {"listen": ["unix:///tmp/x.sock", "tcp://127.0.0.1:7480"]}
    with pytest.raises(ValueError, match="needs mutual TLS"):
        load_config(None, tcp)
    assert load_config(None, {**tcp, "insecure_tcp": True}).insecure_tcp
    tls = {"tls_cert": "c.pem", "tls_key": "k.pem", "client_ca": "ca.pem"}
    assert load_config(None, {**tcp, **tls}).client_ca == "ca.pem"
    with pytest.raises(ValueError, match=r"missing: \['client_ca'\]"):
        load_config(None, {**tcp, "tls_cert": "c.pem", "tls_key": "k.pem"})
    f = tmp_path / "craned.toml"
    f.write_text('listen = "tcp://127.0.0.1:1"\npeers = "craned-b"\ninsecure_tcp = true\n')
    cfg = load_config(f, {})
    assert cfg.peers == ["craned-b"] and cfg.insecure_tcp


def test_worker_tcp_ports_from_file_and_flag(tmp_path: Path) -> None:
    f = tmp_path / "craned.toml"
    f.write_text(f'worker_tcp_ports = [7481, 7490]\nrun_dir = "{tmp_path}"\n')
    assert load_config(f, {}).worker_tcp_ports == [7481, 7490]
    args = parse_args(["--worker-tcp-ports", "9000-9009", "--run-dir", str(tmp_path)])
    assert args.worker_tcp_ports == "9000-9009"
    with pytest.raises(ValueError, match="worker_tcp_ports must be 'FIRST-LAST'"):
        load_config(None, {"worker_tcp_ports": "9000", "run_dir": str(tmp_path)})


def test_module_cache_bound_from_file_and_flag(tmp_path: Path) -> None:
    assert load_config(None, {}).module_cache_bytes == 1 << 30
    f = tmp_path / "craned.toml"
    f.write_text('module_cache_bytes = "512MiB"\n')
    assert load_config(f, {}).module_cache_bytes == 512 << 20
    args = parse_args(["--module-cache-bytes", "0"])
    assert load_config(f, {"module_cache_bytes": args.module_cache_bytes}).module_cache_bytes == 0
    f.write_text('module_cache_bytes = "lots"\n')
    with pytest.raises(ValueError, match="module_cache_bytes"):
        load_config(f, {})


def test_domains_and_vsock_from_file_and_flags(tmp_path: Path) -> None:
    from crane.craned.main import domain_flags

    cfg_file = tmp_path / "craned.toml"
    cfg_file.write_text(
        'domain_socket_group = "0"\nvsock_port = 7000\n'
        '[domains.vm1]\ntenant = "alice"\n[domains.vm2]\n'
    )
    cfg = load_config(cfg_file, {})
    assert {n: d.effective_tenant for n, d in cfg.domains.items()} == {
        "vm1": "alice",
        "vm2": "domain:vm2",
    }
    assert (cfg.vsock_port, cfg.vsock_libvirt_uri) == (7000, "qemu:///system")
    # no --domain flags (what craned passes then): the file's domains stay
    cfg = load_config(cfg_file, {"domains": domain_flags(parse_args([]).domain)})
    assert sorted(cfg.domains) == ["vm1", "vm2"]
    flags = parse_args(["--domain", "web=bob", "--domain", "db", "--vsock-port", "9"])
    cfg = load_config(cfg_file, {"domains": domain_flags(flags.domain), "vsock_port": 9})
    assert {n: d.effective_tenant for n, d in cfg.domains.items()} == {
        "web": "bob",
        "db": "domain:db",
    }
    for text, message in (
        ("vsock_port = -1\n", "vsock_port"),
        ('vsock_port = "x"\n', "vsock_port"),
        ("[domains.vm1]\ncid = 3\n", "unknown keys"),
        ("domains = 3\n", "tables"),
    ):
        cfg_file.write_text(text)
        with pytest.raises(ValueError, match=message):
            load_config(cfg_file, {})
    with pytest.raises(ValueError, match="not accepted"):
        domain_flags(["a/b"])


def test_log_format_from_the_file_or_the_flag(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('log_format = "json"\n')
    assert load_config(f, {}).log_format == "json"
    assert load_config(f, {"log_format": "text"}).log_format == "text"
    assert DaemonConfig().log_format == "text"
    f.write_text('log_format = "yaml"\n')
    with pytest.raises(ValueError, match="log_format"):
        load_config(f, {})
    with pytest.raises(SystemExit):
        parse_args(["--log-format", "yaml"])
    assert parse_args(["--log-format", "json"]).log_format == "json"
