"""The `orch` command line. It parses, calls one library function and prints; nothing else lives here.

Commands are loaded lazily (click's documented LazyGroup pattern): `orch --help` imports click and the
small command modules only, never torch, kubernetes, jinja2 or prometheus_client.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import importlib.util
import sys

import click

from orchestrator import __version__

# name -> "module:attribute", in the order `orch --help` lists them.
COMMANDS: dict[str, str] = {
    "init": "orchestrator.commands.spec_cmds:init",
    "validate": "orchestrator.commands.spec_cmds:validate",
    "render": "orchestrator.commands.spec_cmds:render",
    "run": "orchestrator.commands.run_cmd:run",
    "sweep": "orchestrator.commands.sweep_cmd:sweep",
    "submit": "orchestrator.commands.cluster_cmds:submit",
    "status": "orchestrator.commands.cluster_cmds:status",
    "list": "orchestrator.commands.cluster_cmds:list_jobs",
    "logs": "orchestrator.commands.cluster_cmds:logs",
    "wait": "orchestrator.commands.cluster_cmds:wait",
    "delete": "orchestrator.commands.cluster_cmds:delete",
    "top": "orchestrator.commands.top_cmd:top",
    "stacks": "orchestrator.commands.top_cmd:stacks",
    "build": "orchestrator.commands.build_cmds:build",
    "doctor": "orchestrator.commands.build_cmds:doctor",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in COMMANDS if self._importable(name)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS or not self._importable(cmd_name):
            return None
        module_name, attribute = COMMANDS[cmd_name].split(":")
        command: click.Command = getattr(importlib.import_module(module_name), attribute)
        return command

    @staticmethod
    def _importable(cmd_name: str) -> bool:
        module_name = COMMANDS[cmd_name].split(":")[0]
        return importlib.util.find_spec(module_name) is not None


@click.group(
    cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}
)
@click.version_option(__version__, prog_name="orch")
def cli() -> None:
    """Describe a distributed PyTorch training job once in job.yaml, run it here, or on Kubernetes.

    \b
    Quick start:
      orch init job.yaml             write a commented starter job
      orch run job.yaml              train on this machine (torchrun, CPU or local GPUs)
      orch render job.yaml           print the PyTorchJob and monitoring objects
      orch submit job.yaml --follow  send it to the cluster kubectl points at, stream logs
      orch status NAME | logs NAME | top NAME | delete NAME
    """


def main() -> None:
    """Entry point: run the CLI and turn orch's errors into one line and an exit code."""
    from orchestrator.errors import OrchError, SpecError

    # The process ends with the command: what it built (pydantic's validators, Jinja2's compiled templates)
    # needs no final cycle collection. Frozen after every other exit handler ran, Python's finalization
    # skips them (~30 ms of `orch render`'s CPU; benchmarks/cli.py); objects are still freed by refcount.
    atexit.register(gc.freeze)

    try:
        exit_code = cli.main(standalone_mode=False, prog_name="orch")
    except OrchError as error:
        for each in error.errors if isinstance(error, SpecError) else (error,):  # a job's: each problem
            click.echo(f"error: {one_line(str(each))}", err=True)
        sys.exit(error.exit_code)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as error:  # a bad flag or argument: one line too, with where help is
        hint = ""
        if isinstance(error, click.UsageError) and error.ctx is not None:
            hint = f" (see {error.ctx.command_path} --help)"
        click.echo(f"error: {one_line(error.format_message())}{hint}", err=True)
        sys.exit(error.exit_code)
    except click.exceptions.Exit as exit_:
        sys.exit(exit_.exit_code)
    # A command's integer return value is its exit code (e.g. `orch wait`: 124 on timeout).
    sys.exit(exit_code if isinstance(exit_code, int) else 0)


def one_line(message: str) -> str:
    """An error message as one line: control characters a user's input brought in are shown escaped, and
    credentials in URLs (a `--set` of a tracking URI, a server's answer) are redacted."""
    from orchestrator.redaction import shown

    return shown(message)
