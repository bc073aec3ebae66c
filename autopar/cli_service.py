"""`autopar serve` and `autopar tokens create|list|revoke`. The web stack (fastapi, uvicorn,
sqlalchemy) is imported inside the commands, so `autopar plan` never loads it."""

from __future__ import annotations

from pathlib import Path

import typer

from api.settings import DEFAULT_DATABASE_URL, database_url_from_env
from autopar.cli_secrets import database_url as given_database_url
from autopar.cli_support import busy, require_extra

SERVE_MODULES = ("fastapi", "uvicorn", "sqlalchemy", "alembic")
DB_MODULES = ("sqlalchemy", "alembic")

tokens_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Create, list and revoke API tokens.")

DATABASE_HELP = (
    f"SQLAlchemy URL (default: $AUTOPAR_DATABASE_URL, else {DEFAULT_DATABASE_URL}); one with a password "
    "is visible in `ps`: use $AUTOPAR_DATABASE_URL or --database-url-file"
)
DATABASE_FILE_HELP = "file holding the SQLAlchemy URL (mode 600), instead of --database-url"


def _database_url_file_option() -> Path | None:
    """The --database-url-file option every command that opens the database takes."""
    return typer.Option(None, "--database-url-file", help=DATABASE_FILE_HELP)  # type: ignore[no-any-return]


def serve(
    host: str = typer.Option("127.0.0.1", help="interface to listen on (0.0.0.0: all)"),
    port: int = typer.Option(8000, help="TCP port"),
    database_url: str | None = typer.Option(None, help=DATABASE_HELP),
    database_url_file: Path | None = _database_url_file_option(),
    log_level: str = typer.Option("info", help="uvicorn log level"),
) -> None:
    """Serve the planning API and the web UI at / (migrates the database first; API docs at /docs)."""
    database_url = given_database_url(database_url, database_url_file)
    require_extra("api", "serve", SERVE_MODULES)
    import uvicorn

    from api.app import create_app
    from api.settings import Settings

    settings = Settings(database_url=database_url or database_url_from_env())
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    typer.echo(f"autopar: web UI at http://{shown}:{port}/ , API docs at http://{shown}:{port}/docs", err=True)
    uvicorn.run(create_app(settings), host=host, port=port, log_level=log_level, timeout_graceful_shutdown=10)


def _database(database_url: str | None, database_url_file: Path | None, command: str):  # type: ignore[no-untyped-def]
    database_url = given_database_url(database_url, database_url_file)
    require_extra("api", f"tokens {command}", DB_MODULES)
    from api.db import Database

    db = Database(database_url or database_url_from_env())
    with busy("opening and migrating the database"):
        db.migrate()
    return db


@tokens_app.command("create")
def tokens_create(
    name: str = typer.Option(..., help="who or what holds the token"),
    role: str = typer.Option("user", help="user | admin (a user that may cancel anyone's run) | agent"),
    cluster: str | None = typer.Option(None, help="agent tokens: the cluster whose runs it may lease"),
    database_url: str | None = typer.Option(None, help=DATABASE_HELP),
    database_url_file: Path | None = _database_url_file_option(),
) -> None:
    """Create a token and print it (shown this once; only its sha256 digest is stored). An agent
    token for a cluster preset's name is created, with a notice on stderr that the profiles of
    its runs will not calibrate the preset."""
    db = _database(database_url, database_url_file, "create")
    from api.auth import create_token

    try:
        with db.write_session() as session:
            row, secret = create_token(session, name, role, cluster)  # type: ignore[arg-type]
            ident = row.id
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    finally:
        db.dispose()
    typer.echo(f"created token {ident} ({role}{' for cluster ' + cluster if cluster else ''}); it is shown only once:",
               err=True)
    if role == "agent" and cluster:
        from api.calibration import is_preset

        if is_preset(cluster):
            typer.echo(preset_agent_notice(cluster), err=True)
    typer.echo(secret)


def preset_agent_notice(cluster: str) -> str:
    """What `tokens create` says (on stderr) for an agent token of a cluster preset's name: the
    token works, the runs' profiles are stored, but they never calibrate the preset."""
    return (
        f"notice: {cluster!r} is a cluster preset. This agent runs its queued runs and uploads their "
        f"profiles, but profiles never calibrate a preset: plans for {cluster!r} keep the global "
        "calibration (fitted on published runs). To calibrate a cluster from profiles, register one of "
        f"your own (POST /v1/clusters {{\"name\": \"lab-{cluster}\", \"spec\": {{\"preset\": \"{cluster}\"}}}}) "
        "and create the agent token for that name (README: Runner agent and calibration from profiles)."
    )


@tokens_app.command("list")
def tokens_list(
    database_url: str | None = typer.Option(None, help=DATABASE_HELP),
    database_url_file: Path | None = _database_url_file_option(),
) -> None:
    """List tokens (id, prefix, role, cluster, created, revoked); never the secrets."""
    db = _database(database_url, database_url_file, "list")
    from api.auth import list_tokens

    try:
        with db.read_session() as session:
            rows = list_tokens(session)
            typer.echo(f"{'id':>5}  {'prefix':10}  {'role':5}  {'cluster':16}  {'created (UTC)':19}  {'revoked':19}  name")
            for r in rows:
                revoked = r.revoked_at.strftime("%Y-%m-%d %H:%M:%S") if r.revoked_at else "-"
                typer.echo(
                    f"{r.id:>5}  {r.prefix:10}  {r.role:5}  {r.cluster or '-':16}  "
                    f"{r.created_at.strftime('%Y-%m-%d %H:%M:%S'):19}  {revoked:19}  {r.name}"
                )
    finally:
        db.dispose()


@tokens_app.command("revoke")
def tokens_revoke(
    token_id: int = typer.Argument(..., help="id from `autopar tokens list`"),
    database_url: str | None = typer.Option(None, help=DATABASE_HELP),
    database_url_file: Path | None = _database_url_file_option(),
) -> None:
    """Revoke a token: requests with it are refused from now on."""
    db = _database(database_url, database_url_file, "revoke")
    from api.auth import revoke_token

    try:
        with db.write_session() as session:
            row = revoke_token(session, token_id)
    finally:
        db.dispose()
    if row is None:
        typer.echo(f"error: no token {token_id}", err=True)
        raise typer.Exit(2)
    typer.echo(f"revoked token {token_id} ({row.name})")


def register(app: typer.Typer) -> None:
    app.command()(serve)
    app.add_typer(tokens_app, name="tokens")
