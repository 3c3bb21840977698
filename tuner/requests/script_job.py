"""A queued job's training command (:class:`ScriptJob`): what ``dstune queue JOB.json -- <command>`` stores beside
the job, for a worker that trusts its folder (``dstune worker --allow-scripts DIR``) to measure instead of dstune's
trainer. Only ``dstune queue`` puts one in a job: the API refuses a job with a command (403), so no request makes a
worker run code (:mod:`tuner.measure.script.trust` is the worker's own check).

Example:
    >>> job = ScriptJob(argv=["deepspeed", "train.py", "--deepspeed", "ds.json"], cwd="/srv/team/proj")
    >>> job.command().display()
    'deepspeed train.py --deepspeed ds.json'
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from tuner.measure.script.command import ScriptCommand
from tuner.requests.strict import RequestModel

Argument = Annotated[str, Field(max_length=4096)]


class ScriptJob(RequestModel):
    """The command as ``dstune tune -- <command>`` takes it (:class:`tuner.measure.script.command.ScriptCommand`)."""

    argv: list[Argument] = Field(min_length=1, max_length=1024, description="The command, as the user runs it.")
    cwd: Annotated[str, Field(min_length=1, max_length=4096)] = Field(description="The folder it runs in.")
    config_at: Annotated[str, Field(max_length=4096)] | None = Field(
        None, description="Where the command reads its ds_config (--ds-config-at); null: found by itself."
    )
    arg_mappings: list[Annotated[list[Argument], Field(min_length=2, max_length=2)]] = Field(
        default_factory=list, description="(ds_config key, flag) pairs: the command's own batch flags."
    )

    def command(self) -> ScriptCommand:
        """The command to run."""
        return ScriptCommand.from_dict(self.model_dump())

    @classmethod
    def of(cls, command: ScriptCommand) -> ScriptJob:
        """From the CLI's command."""
        return cls.model_validate(command.to_dict())


__all__ = ["ScriptJob"]
