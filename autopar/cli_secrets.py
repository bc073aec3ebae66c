"""Secrets the service commands need (the agent's token, a database URL with a password), read from
the environment or a file, never required on the command line: every user of a machine can read
every process's argv (`ps`, /proc/PID/cmdline). A secret given as an option still works, with a
warning that says where to put it instead. Imports only typer and the standard library."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import typer

AGENT_TOKEN_ENV = "AUTOPAR_AGENT_TOKEN"
DATABASE_URL_ENV = "AUTOPAR_DATABASE_URL"


def warn(message: str) -> None:
    typer.echo(f"warning: {message}", err=True)


def read_secret_file(path: Path, option: str) -> str:
    """The file's content without surrounding whitespace; a usage error when it is unreadable or
    empty, a warning when users other than its owner may read it."""
    try:
        text = path.read_text().strip()
        mode = path.stat().st_mode
    except OSError as exc:
        raise typer.BadParameter(f"cannot read {path}: {exc.strerror or exc}", param_hint=option) from exc
    if not text:
        raise typer.BadParameter(f"{path} is empty", param_hint=option)
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        warn(f"{path} ({option}) is readable by other users (mode {stat.filemode(mode)}); chmod 600 {path}")
    return text


def agent_token(token: str | None, token_file: Path | None) -> str:
    """The agent's token: --token-file, else --token (warned: visible in `ps`), else $AUTOPAR_AGENT_TOKEN."""
    if token is not None and token_file is not None:
        raise typer.BadParameter("give the agent token once: --token-file or --token, not both", param_hint="--token")
    if token_file is not None:
        return read_secret_file(token_file, "--token-file")
    if token is not None:
        warn(f"--token puts the agent token on the command line, where `ps` shows it to every user of this "
             f"machine; set {AGENT_TOKEN_ENV} or use --token-file PATH instead")
        return token
    from_env = os.environ.get(AGENT_TOKEN_ENV, "").strip()
    if not from_env:
        raise typer.BadParameter(f"no agent token: set {AGENT_TOKEN_ENV} or give --token-file PATH "
                                 "(autopar tokens create --role agent --cluster NAME makes one)", param_hint="--token-file")
    return from_env


def has_password(url: str) -> bool:
    """Whether a database URL carries a password (user:password@host, or ?password=...)."""
    try:
        parts = urlsplit(url)
        return bool(parts.password) or "password" in parse_qs(parts.query)
    except ValueError:
        return False


def database_url(url: str | None, url_file: Path | None) -> str | None:
    """The database URL a command was given: --database-url-file, else --database-url (warned when
    it holds a password), else None (the caller falls back to $AUTOPAR_DATABASE_URL, then SQLite)."""
    if url is not None and url_file is not None:
        raise typer.BadParameter("give the database URL once: --database-url-file or --database-url, not both",
                                 param_hint="--database-url")
    if url_file is not None:
        return read_secret_file(url_file, "--database-url-file")
    if url is not None and has_password(url):
        warn(f"--database-url puts the database password on the command line, where `ps` shows it to every "
             f"user of this machine; set {DATABASE_URL_ENV} or use --database-url-file PATH instead")
    return url
