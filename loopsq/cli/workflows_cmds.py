"""``loopsq workflows ...``: validate, create, list, show and archive workflow specs."""

from __future__ import annotations

import os
from typing import Any, ClassVar

import click

from loopsq.cli.app import get_app, json_flag
from loopsq.cli.feature_flags import tags_flag
from loopsq.cli.options import quote
from loopsq.domain.redaction import public_workflow
from loopsq.domain.tags import validate_tags
from loopsq.domain.text import shown
from loopsq.domain.workflow_spec import load_workflow_file, workflow_body_from_json
from loopsq.errors import NotFoundError, ValidationError
from loopsq.mirror import queries
from loopsq.system.prompt_files import resolve_spec_prompt_files


class AliasGroup(click.Group):
    """A group whose commands may have aliases (``ls`` for ``list``)."""

    aliases: ClassVar[dict[str, str]] = {"ls": "list"}

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, self.aliases.get(cmd_name, cmd_name))


@click.group("workflows", cls=AliasGroup)
def workflows() -> None:
    """Workflow specs: DAGs of command and agent steps."""


def _read_spec(path: str, name: str | None) -> dict[str, Any]:
    if name is not None and not name.strip():
        raise ValidationError(f"--name must be a non-empty string, got {quote(name)}")
    spec = load_workflow_file(path)
    # promptFile paths are relative to the spec file's directory (0.3.54).
    spec = resolve_spec_prompt_files(spec, os.path.dirname(os.path.abspath(path)))
    return workflow_body_from_json(spec, name)


@workflows.command("validate")
@click.argument("file", metavar="FILE")
@click.option("--name", metavar="NAME", help="Use NAME instead of the file's name.")
@click.option("--preflight", is_flag=True, help="Also check every step's executable and account.")
@json_flag
def validate(file: str, name: str | None, preflight: bool) -> None:
    """Check a workflow spec file without storing it."""
    body = _read_spec(file, name)
    result: dict[str, Any] = {"valid": True, "workflow": public_workflow({"id": "validation", **body})}
    if preflight:
        from loopsq.executor.preflight import preflight_workflow_body

        result["preflight"] = preflight_workflow_body(body)
    get_app().emit(result, f"valid workflow {body['name']} steps={len(body['steps'])}")


@workflows.command("create")
@click.argument("file", metavar="FILE")
@click.option("--name", metavar="NAME", help="Use NAME instead of the file's name.")
@click.option("--tag", "tags", multiple=True, metavar="KEY:VALUE",
              help="Tag the workflow (repeat; added to the file's tags, a key given here wins).")
@json_flag
def create(file: str, name: str | None, tags: tuple[str, ...]) -> None:
    """Store a workflow spec from a JSON file."""
    flagged = tags_flag(tags)
    body = _read_spec(file, name)
    if flagged:
        body["tags"] = validate_tags({**(body.get("tags") or {}), **flagged}, "--tag")
    app = get_app()
    spec = app.workflows().create(body, app.now())
    app.emit(public_workflow(spec), f"created workflow {spec['id']} ({spec['name']}) steps={len(spec['steps'])}")


@workflows.command("list")
@click.option("--status", default="active", show_default=True, metavar="STATUS", help="active, archived or all.")
@click.option("--tag", "tags", multiple=True, metavar="KEY:VALUE",
              help="Only workflows carrying this tag (repeat: all of them).")
@json_flag
def list_workflows(status: str, tags: tuple[str, ...]) -> None:
    """List workflow specs (with --tag, those carrying every tag given)."""
    if status not in ("active", "archived", "all"):
        raise ValidationError(f"--status must be active, archived or all, got {quote(status)}")
    wanted = tags_flag(tags)
    app = get_app()
    specs = queries.list_workflows(app.mirror(), status=None if status == "all" else status, limit=200,
                                   tags=wanted)
    app.emit(
        [public_workflow(spec) for spec in specs],
        lambda: "\n".join(
            f"{s['id']}  {s['status']:<8}  steps={len(s.get('steps', []))}  {s['name']}" for s in specs
        ),
    )


@workflows.command("show")
@click.argument("id_or_name")
@json_flag
def show(id_or_name: str) -> None:
    """Show one workflow spec as JSON."""
    app = get_app()
    spec = queries.find_workflow(app.mirror(), id_or_name)
    if spec is None:
        raise NotFoundError(f"workflow not found: {shown(id_or_name)}")
    app.emit(public_workflow(spec))


@workflows.command("archive")
@click.argument("id_or_name")
@json_flag
def archive(id_or_name: str) -> None:
    """Archive a workflow spec (its name becomes free; loops that use it by id keep working)."""
    app = get_app()
    spec = app.workflows().archive(id_or_name, app.now())
    app.emit(public_workflow(spec), f"{spec['id']} {spec['status']}")
