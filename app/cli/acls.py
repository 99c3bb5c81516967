"""``kip98 acls``: kafka-acls.sh for the ``acls`` table, and the PostgreSQL roles script.

The command runs as ``KIP98_PRINCIPAL``; with authorization on, changing ACLs needs Alter
on the cluster (a super user, ``User:admin`` by default, always has it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import click

from app.admin import AclBinding, AclBindingFilter, AdminClient
from app.cli.errors import CliError
from app.cli.output import emit, output_option
from app.security import rules
from app.security.roles import apply_roles, roles_sql

_COLUMNS = [
    "principal",
    "permission",
    "operation",
    "resource_type",
    "pattern_type",
    "resource_name",
]


def _resource(
    topic: str | None, group: str | None, transactional_id: str | None, cluster: bool
) -> tuple[str, str] | None:
    """(resource type, name) from the one resource option given; None when none is."""
    chosen = [
        (kind, name)
        for kind, name in (
            (rules.TOPIC, topic),
            (rules.GROUP, group),
            (rules.TRANSACTIONAL_ID, transactional_id),
            (rules.CLUSTER, rules.CLUSTER_NAME if cluster else None),
        )
        if name is not None
    ]
    if len(chosen) > 1:
        raise CliError("give only one of --topic, --group, --transactional-id, --cluster")
    return chosen[0] if chosen else None


Command = Callable[..., None]


def _resource_options(required: bool) -> Callable[[Command], Command]:
    """--topic/--group/--transactional-id/--cluster, handed to the command as one
    ``resource`` (type, name), None when none was given unless ``required``; and
    --prefixed."""

    def decorate(command: Command) -> Command:
        @functools.wraps(command)
        def chosen(
            topic: str | None,
            group: str | None,
            transactional_id: str | None,
            cluster: bool,
            **rest: Any,
        ) -> None:
            resource = _resource(topic, group, transactional_id, cluster)
            if resource is None and required:
                raise CliError("give one of --topic, --group, --transactional-id, --cluster")
            command(resource=resource, **rest)

        for option in (
            click.option("--prefixed", is_flag=True, help="The name is a prefix."),
            click.option("--cluster", is_flag=True, help="The cluster resource."),
            click.option("--transactional-id", help="A producer's transactional.id."),
            click.option("--group", help="A consumer group id."),
            click.option("--topic", help="A topic name (or prefix with --prefixed; * for all)."),
        ):
            chosen = option(chosen)
        return chosen

    return decorate


_OPERATION = click.Choice(rules.OPERATIONS)
_PERMISSION = click.Choice(rules.PERMISSIONS)


@click.group("acls")
def acls_group() -> None:
    """Manage ACLs (checked when KIP98_AUTHORIZATION=1) and the database roles."""


@acls_group.command()
@click.option("--principal", required=True, help="Who, as User:name (User:* for everyone).")
@click.option("--operation", "operations", type=_OPERATION, multiple=True, required=True)
@click.option("--permission", type=_PERMISSION, default=rules.ALLOW, show_default=True)
@_resource_options(required=True)
def add(
    principal: str,
    operations: tuple[str, ...],
    permission: str,
    resource: tuple[str, str],
    prefixed: bool,
) -> None:
    """Add ACLs: PRINCIPAL may (or may not) perform OPERATION on one resource."""
    pattern = rules.PREFIXED if prefixed else rules.LITERAL
    bindings = [
        AclBinding(principal, resource[0], resource[1], op, permission, pattern)
        for op in operations
    ]
    with AdminClient() as admin:
        for future in set(admin.create_acls(bindings).values()):
            future.result()
    for b in bindings:
        click.echo(f"Added: {_describe(b)}")


def _filter(
    principal: str | None,
    operation: str | None,
    permission: str | None,
    resource: tuple[str, str] | None,
    prefixed: bool,
) -> AclBindingFilter:
    return AclBindingFilter(
        principal=principal,
        resource_type=resource[0] if resource else None,
        resource_name=resource[1] if resource else None,
        operation=operation,
        permission=permission,
        pattern_type=rules.PREFIXED if prefixed else (rules.LITERAL if resource else None),
    )


def _filter_options(resource_required: bool) -> Callable[[Command], Command]:
    """The options that select ACLs (principal, operation, permission, one resource),
    handed to the command as one ``AclBindingFilter``; ``remove`` needs the resource, so
    that it cannot remove every ACL by omission."""

    def decorate(command: Command) -> Command:
        @functools.wraps(command)
        def selected(
            principal: str | None,
            operation: str | None,
            permission: str | None,
            resource: tuple[str, str] | None,
            prefixed: bool,
            **rest: Any,
        ) -> None:
            command(_filter(principal, operation, permission, resource, prefixed), **rest)

        selecting = _resource_options(resource_required)(selected)
        for option in (
            click.option("--permission", type=_PERMISSION),
            click.option("--operation", type=_OPERATION),
            click.option("--principal"),
        ):
            selecting = option(selecting)
        return selecting

    return decorate


@acls_group.command("list")
@_filter_options(resource_required=False)
@output_option
def list_(acl_filter: AclBindingFilter, output: str) -> None:
    """List ACLs, optionally only those matching the options given."""
    with AdminClient() as admin:
        found = admin.describe_acls(acl_filter).result()
    emit([asdict(b) for b in found], output, columns=_COLUMNS)


@acls_group.command()
@_filter_options(resource_required=True)
def remove(acl_filter: AclBindingFilter) -> None:
    """Remove the ACLs of one resource (narrowed by --principal/--operation/--permission)."""
    with AdminClient() as admin:
        removed = admin.delete_acls([acl_filter])[acl_filter].result()
    for b in removed:
        click.echo(f"Removed: {_describe(b)}")
    if not removed:
        click.echo("No matching ACLs.")


@acls_group.command()
@click.option("--print-sql", is_flag=True, help="Print the script instead of running it.")
def roles(print_sql: bool) -> None:
    """Create the PostgreSQL roles kip98_admin and kip98_client with their grants."""
    script = roles_sql()
    if print_sql:
        click.echo(script, nl=False)
        return
    from app.broker import Broker

    with Broker.connect().engine.begin() as conn:
        apply_roles(conn)
    click.echo("Roles kip98_admin and kip98_client are in place.")


def _describe(b: AclBinding) -> str:
    name = "" if b.resource_type == rules.CLUSTER else f" {b.pattern_type} {b.resource_name!r}"
    return f"{b.permission} {b.principal} {b.operation} on {b.resource_type}{name}"
