"""The global options (``--daemon``, ``--cert``, ``--key``, ``--ca``) parse before or after
every subcommand, the parser's own list of subcommands included (a new one is covered by
itself), and a failing command says why on one line."""

from __future__ import annotations

import argparse
import os

import pytest

from crane.cli.main import GLOBAL_OPTIONS, build_parser, main

VALUES = {"--daemon": "unix:///tmp/x.sock", "--cert": "c.pem", "--key": "c.key", "--ca": "ca.pem"}
GIVEN = [w for flag, value in VALUES.items() for w in (flag, value)]


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _required(sp: argparse.ArgumentParser) -> tuple[list[str], list[str]]:
    """Arguments a subcommand cannot parse without (a dummy value each), and its trailing
    command (``crane run -- PROGRAM``), taken from the parser so new subcommands need no
    entry here."""
    words, tail = [], []
    for a in sp._actions:
        if not a.option_strings:
            if a.nargs == argparse.REMAINDER:
                tail = ["--", "prog", "--daemon", "not-ours"]  # the program's own arguments
            elif a.nargs not in ("?", "*"):
                words.append("1")
        elif a.required:
            words += [a.option_strings[0], "1"]
    return words, tail


def test_the_globals_are_the_documented_four() -> None:
    assert [flag for flag, _ in GLOBAL_OPTIONS] == list(VALUES)


@pytest.mark.parametrize("command", sorted(_subcommands()))
def test_global_options_before_and_after_every_subcommand(command: str) -> None:
    words, tail = _required(_subcommands()[command])
    forms = {
        "before": [*GIVEN, command, *words, *tail],
        "after the name": [command, *GIVEN, *words, *tail],
    }
    if not tail:  # options after the subcommand's own arguments
        forms["after everything"] = [command, *words, *GIVEN]
    for where, argv in forms.items():
        args = build_parser().parse_args(argv)
        got = {flag: getattr(args, flag[2:]) for flag in VALUES}
        assert got == VALUES, (where, argv)
        if tail:
            assert args.cmd[-2:] == ["--daemon", "not-ours"]  # the program's, not Crane's


@pytest.mark.parametrize("command", sorted(_subcommands()))
def test_after_the_subcommand_wins_and_absent_is_none(command: str) -> None:
    words, tail = _required(_subcommands()[command])
    args = build_parser().parse_args(["--daemon", "a", command, "--daemon", "b", *words, *tail])
    assert args.daemon == "b"
    args = build_parser().parse_args([command, *words, *tail])
    assert (args.daemon, args.cert, args.key, args.ca) == (None, None, None, None)


@pytest.mark.parametrize("command", ["devices", "ps"])
def test_listings_take_json(command: str) -> None:
    assert build_parser().parse_args([command, "--json"]).json is True


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["devices", "--daemon", "unix:///nonexistent/crane.sock"], "cannot reach the daemon"),
        (["ps", "--json", "--daemon", "unix:///nonexistent/crane.sock"], "cannot reach"),
        (["checkpoint", "--session", "s", "-o", "f", "--daemon", "unix:///nonexistent/c"], "s"),
        (["migrate", "--session", "s", "--to", "t", "--daemon", "unix:///nonexistent/c"], "s"),
        (
            [
                "ps",
                "--daemon",
                "tcp://127.0.0.1:9",
                "--cert",
                "/nonexistent.pem",
                "--key",
                "/nonexistent.key",
                "--ca",
                "/nonexistent-ca.pem",
            ],
            "nonexistent",
        ),
    ],
)
def test_failures_are_one_line_with_the_reason(
    argv: list[str],
    expect: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # main() exports --cert/--key/--ca as CRANE_TLS_* for the clients it makes: not past this
    # test (later tests' daemons and CLIs would inherit the nonexistent files)
    monkeypatch.setattr(os, "environ", dict(os.environ))
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("crane") and expect in err, err


def test_half_a_certificate_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ps", "--cert", "/nonexistent.pem"]) == 2
    assert "needs its key" in capsys.readouterr().err
