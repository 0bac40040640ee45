"""``monarch.configure`` and friends: Monarch 0.7's configuration API over our ``MONARCH_*`` settings.

Checks that change our own settings run in a fresh Python process (a real
client runtime, a real broker, real procs), because the settings are read
when the runtime starts and the runtime of this test process may already
run. Checks of Monarch's inert keys and of errors run here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import monarch
from monarch.config import (
    clear_runtime_config,
    configure,
    configured,
    get_global_config,
    get_runtime_config,
    parametrize_config,
    parametrize_config_pointwise,
)
from monarch.config.keys import format_duration, parse_duration

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_script(
    body: str, nats_url: str, timeout: float = 240.0, extra_env: dict[str, str] | None = None
) -> dict:
    """Run ``body`` in a fresh interpreter against the test broker; its last line is JSON."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    env["MONARCH_NATS_URL"] = nats_url
    env.update(extra_env or {})
    env["PYTHONPATH"] = REPO
    script = "import json, warnings\n" + textwrap.dedent(body)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_top_level_names_are_the_config_functions():
    assert monarch.configure is configure
    assert monarch.configured is configured
    assert monarch.get_global_config is get_global_config
    assert monarch.get_runtime_config is get_runtime_config
    assert monarch.clear_runtime_config is clear_runtime_config


def test_unknown_key_is_a_value_error_naming_it_and_nothing_is_applied():
    before = get_runtime_config()
    with pytest.raises(ValueError, match="`does_not_exist`"):
        configure(tail_log_lines=5, does_not_exist=42)
    assert get_runtime_config() == before  # the valid key was not applied either
    with pytest.raises(ValueError, match="`also_bogus`"):
        with configured(also_bogus=1):
            pass


def test_wrong_types_are_type_errors_naming_the_key():
    with pytest.raises(TypeError, match="tail_log_lines"):
        configure(tail_log_lines="many")
    with pytest.raises(TypeError, match="message_delivery_timeout"):
        configure(message_delivery_timeout=5)  # Monarch wants a humantime string
    with pytest.raises(TypeError, match="message_delivery_timeout"):
        configure(message_delivery_timeout="soon")
    with pytest.raises(TypeError, match="default_encoding"):
        configure(default_encoding="json")
    with pytest.raises(TypeError, match="MONARCH_HEARTBEAT_TIMEOUT"):
        configure(heartbeat_timeout="abc")


def test_out_of_range_values_of_our_settings_are_value_errors():
    with pytest.raises(ValueError, match="MONARCH_HEARTBEAT_TIMEOUT"):
        configure(heartbeat_timeout=-1)
    with pytest.raises(ValueError, match="MONARCH_NAMESPACE"):
        configure(namespace="has.dots")
    with pytest.raises(ValueError, match="MONARCH_WIRE"):
        configure(wire="xml")


def test_configured_sets_monarch_keys_and_restores_them():
    with configured(enable_log_forwarding=True, tail_log_lines=100) as config:
        assert config["enable_log_forwarding"] is True
        assert config["tail_log_lines"] == 100
        assert get_runtime_config()["tail_log_lines"] == 100
        with configured(tail_log_lines=7, message_delivery_timeout="5s") as inner:
            assert inner["tail_log_lines"] == 7
            assert inner["message_delivery_timeout"] == "5s"
            assert inner["enable_log_forwarding"] is True
        assert get_global_config()["tail_log_lines"] == 100
    config = get_global_config()
    assert config["enable_log_forwarding"] is False
    assert config["tail_log_lines"] == 0
    assert config["message_delivery_timeout"] == "30s"


def test_configured_restores_after_an_exception_in_the_block():
    with pytest.raises(KeyError):
        with configured(tail_log_lines=3):
            raise KeyError("boom")
    assert get_global_config()["tail_log_lines"] == 0


def test_default_transport_takes_monarchs_channel_transport():
    from monarch.actor import ChannelTransport

    assert get_global_config()["default_transport"] == ChannelTransport.Unix
    with configured(default_transport=ChannelTransport.TcpWithHostname) as config:
        assert config["default_transport"] == ChannelTransport.TcpWithHostname
    with configured(default_transport="tcp://127.0.0.1:8080") as config:
        assert config["default_transport"] == "tcp://127.0.0.1:8080"
    with pytest.raises(TypeError, match="default_transport"):
        configure(default_transport=42)
    for bad in ("invalid://scheme", "random_string"):  # as Monarch: ValueError
        with pytest.raises(ValueError, match="default_transport"):
            configure(default_transport=bad)


def test_enable_transport_is_monarchs_spelling_of_default_transport_and_refuses_tls():
    """Monarch scripts call it before attaching to workers: kept like the key, no effect on the
    wire (everything goes through the broker); asking for TLS must not silently run without.
    Monarch's rules hold: one transport per process, chosen before the first use. Each case
    runs in a fresh interpreter, where nothing has been enabled or started yet."""
    script = textwrap.dedent("""
        import sys
        from monarch.actor import ChannelTransport, enable_transport, this_host
        from monarch.config import get_global_config
        given = eval(sys.argv[1])
        try:
            print(repr(enable_transport(given)), repr(get_global_config()["default_transport"]))
            print(repr(enable_transport(given)))  # the same again: a no-op
            other = "ipc" if given != "ipc" else "tcp"
            enable_transport(other)
        except Exception as e:
            print(type(e).__name__, str(e).splitlines()[0])
        """)  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def run(given: str) -> list[str]:
        r = subprocess.run([sys.executable, "-c", script, given], env=env, capture_output=True,
                           text=True, timeout=120)  # fmt: skip
        assert r.returncode == 0, r.stderr
        return r.stdout.strip().splitlines()

    for given, kept in [
        ('"tcp"', "<ChannelTransport.TcpWithHostname: 'tcp_hostname'>"),
        ('"ipc"', "<ChannelTransport.Unix: 'unix'>"),
        ("ChannelTransport.TcpWithLocalhost", "<ChannelTransport.TcpWithLocalhost: 'tcp_localhost'>"),
        ('"tcp://10.0.0.7:26600@tcp://0.0.0.0:26600"', "'tcp://10.0.0.7:26600@tcp://0.0.0.0:26600'"),
        ('"ipc:///tmp/worker.sock"', "'ipc:///tmp/worker.sock'"),
    ]:  # fmt: skip
        out = run(given)
        assert out[0] == f"None {kept}" and out[1] == "None", out
        assert out[2].startswith("RuntimeError Only one transport type may be enabled"), out
    for tls in (
        '"tls"',
        '"metatls"',
        '"metatls-hostname"',
        "ChannelTransport.Tls",
        '"metatls://h:1"',
    ):
        (line,) = run(tls)
        assert line.startswith("NotImplementedError") and "MONARCH_NATS_TLS" in line, line
    for bad in ('"quic"', '"http://h:80"', '"tcp://"', '"tcp://h:1@nowhere"'):
        (line,) = run(bad)
        assert line.startswith("ValueError") and "not a transport" in line, line
    # Once the runtime runs, only the default (Unix) may still be asked for.
    started = "this_host().spawn_procs().initialized.get(); given = eval(sys.argv[1])"
    late = script.replace("given = eval(sys.argv[1])", started)
    r = subprocess.run([sys.executable, "-c", late, '"tcp"'], env=env, capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.stdout.startswith("RuntimeError `enable_transport()` must be called before"), r


def test_clear_runtime_config_empties_the_layer():
    configure(tail_log_lines=4, rdma_max_nics_per_buffer=2)
    assert get_runtime_config() == {"tail_log_lines": 4, "rdma_max_nics_per_buffer": 2}
    clear_runtime_config()
    assert get_runtime_config() == {}
    assert get_global_config()["tail_log_lines"] == 0
    assert get_global_config()["rdma_max_nics_per_buffer"] is None


def test_global_config_lists_our_settings_from_the_environment_and_masks_credentials(nats_url):
    out = run_script(
        """
        from monarch.config import Encoding, get_global_config
        c = get_global_config()
        print(json.dumps({"token": c["nats_token"], "url": c["nats_url"],
                          "window": c["flow_window"], "json": c["default_encoding"] is Encoding.Json,
                          "text": repr(c)}))
        """,
        nats_url,
        extra_env={
            "MONARCH_NATS_TOKEN": "s3cret-token",
            "MONARCH_NATS_URL": "nats://user:pw@127.0.0.1:4222",
            "MONARCH_FLOW_WINDOW": "7",
            "MONARCH_WIRE": "json",
        },
    )
    assert out["token"] == "***"
    assert out["url"] == "nats://***@127.0.0.1:4222"
    assert "s3cret" not in out["text"] and "pw@" not in out["text"]
    assert out["window"] == 7
    assert out["json"] is True


def test_invalid_credentials_are_not_echoed_in_errors():
    with pytest.raises(ValueError, match="MONARCH_NATS_JOB_KEY") as info:
        configure(nats_job_key="short-secret")  # under the 16 characters a key needs
    assert "short-secret" not in str(info.value)


def test_durations_are_reported_as_monarch_writes_them():
    with configured(message_delivery_timeout="90sec", cleanup_timeout="1500ms") as config:
        assert config["message_delivery_timeout"] == "1m 30s"
        assert config["cleanup_timeout"] == "1s 500ms"


def test_humantime_durations_round_trip():
    assert parse_duration("k", "1m 30s") == 90.0
    assert parse_duration("k", "500ms") == 0.5
    assert parse_duration("k", "5sec") == 5.0
    assert parse_duration("k", "2h") == 7200.0
    assert format_duration(90.0) == "1m 30s"
    assert format_duration(0.5) == "500ms"
    assert format_duration(60.0) == "1m"
    assert format_duration(1.5) == "1s 500ms"


def test_configure_before_start_reaches_the_client_runtime_and_its_procs(nats_url):
    """Our settings and the Monarch keys mapped onto them, set before the first mesh."""
    out = run_script(
        """
        import monarch
        from monarch.actor import Actor, endpoint, this_host
        from monarch.config import Encoding, get_global_config

        class Probe(Actor):
            @endpoint
            def config(self) -> dict:
                c = get_global_config()
                return {k: c[k] for k in ("namespace", "heartbeat_timeout", "spawn_timeout",
                                          "mesh_proc_spawn_max_idle", "wire")}

        monarch.configure(
            namespace="cfgtest",
            heartbeat_timeout=7.5,
            mesh_proc_spawn_max_idle="1m 30s",
            default_encoding=Encoding.Json,
        )
        procs = this_host().spawn_procs(per_host={"gpus": 2})
        remote = procs.spawn("probe", Probe).config.call().get(timeout=60)
        from monarch.core.process_runtime import runtime
        rt = runtime().settings
        client = {"namespace": rt.namespace, "heartbeat_timeout": rt.heartbeat_timeout,
                  "spawn_timeout": rt.spawn_timeout, "wire": rt.wire}
        procs.stop().get(timeout=60)
        print(json.dumps({"client": client, "procs": [v for _, v in remote.items()]}))
        """,
        nats_url,
    )
    assert out["client"] == {
        "namespace": "cfgtest",
        "heartbeat_timeout": 7.5,
        "spawn_timeout": 90.0,
        "wire": "json",
    }
    assert len(out["procs"]) == 2
    for proc in out["procs"]:
        assert proc == {
            "namespace": "cfgtest",
            "heartbeat_timeout": 7.5,
            "spawn_timeout": 90.0,
            "mesh_proc_spawn_max_idle": "1m 30s",
            "wire": "json",
        }


def test_after_start_changing_our_settings_is_refused_and_restores_keep_them(nats_url):
    out = run_script(
        """
        import monarch
        from monarch.actor import this_host, shutdown_context
        from monarch.config import configured, configure, get_global_config, get_runtime_config

        result = {}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with configured(heartbeat_timeout=6.0):
                procs = this_host().spawn_procs(per_host={"gpus": 1})
                procs.initialized.get(timeout=60)
        result["kept_warning"] = any("heartbeat_timeout" in str(w.message) for w in caught)
        result["kept_value"] = get_global_config()["heartbeat_timeout"]
        try:
            configure(heartbeat_timeout=9.0)
            result["refused"] = None
        except RuntimeError as e:
            result["refused"] = str(e)
        configure(heartbeat_timeout=6.0)  # the value in effect: not a change
        with configured(tail_log_lines=9, message_delivery_timeout="5s") as c:  # inert keys
            result["inert"] = [c["tail_log_lines"], c["message_delivery_timeout"]]
        procs.stop().get(timeout=60)
        shutdown_context().get(timeout=60)
        monarch.clear_runtime_config()  # no runtime now: the environment's value again
        result["after_shutdown"] = get_global_config()["heartbeat_timeout"]
        result["layer"] = get_runtime_config()
        print(json.dumps(result))
        """,
        nats_url,
    )
    assert out["kept_warning"] is True
    assert out["kept_value"] == 6.0
    assert out["refused"] is not None and "heartbeat_timeout" in out["refused"]
    assert "shutdown_context" in out["refused"]
    assert out["inert"] == [9, "5s"]
    assert out["after_shutdown"] == 3.0
    assert out["layer"] == {}


@parametrize_config(tail_log_lines=[1, 2], enable_log_forwarding=[True, False])
def test_parametrize_config_runs_every_combination(request):
    config = get_global_config()
    expected = request.node.callspec.params["_config_overrides"]
    assert (config["tail_log_lines"], config["enable_log_forwarding"]) == (
        expected["tail_log_lines"],
        expected["enable_log_forwarding"],
    )


@parametrize_config_pointwise(tail_log_lines=[5, 6], message_delivery_timeout=["5s", "6s"])
def test_parametrize_config_pointwise_zips_the_values():
    config = get_global_config()
    assert (config["tail_log_lines"], config["message_delivery_timeout"]) in [(5, "5s"), (6, "6s")]


def test_parametrize_config_makes_one_run_per_combination():
    def body():
        pass

    (mark,) = parametrize_config(tail_log_lines=[1, 2], prefix_with_rank=[True, False])(
        body
    ).pytestmark
    assert sorted((c["tail_log_lines"], c["prefix_with_rank"]) for c in mark.args[1]) == [
        (1, False),
        (1, True),
        (2, False),
        (2, True),
    ]
    (mark,) = parametrize_config_pointwise(tail_log_lines=[1, 2], prefix_with_rank=[True, False])(
        body
    ).pytestmark
    assert mark.args[1] == [
        {"tail_log_lines": 1, "prefix_with_rank": True},
        {"tail_log_lines": 2, "prefix_with_rank": False},
    ]
    with pytest.raises(ValueError, match="equally many"):
        parametrize_config_pointwise(tail_log_lines=[1], prefix_with_rank=[True, False])
    assert get_global_config()["tail_log_lines"] == 0  # nothing applied outside a run
