"""The course's own helpers: what a chapter imports (`from scalekit.course import finding, table, ...`: sizes
picked for the hardware, Before/After tables, the sentence that fits a measurement), the figures of memory and
step time (`figures`), and other people's published figures shown beside a reader's own (`published_figures`,
never used as results)."""

from .chapter import (
           Table,
           finding,
           finding_verdict,
           on_gpu,
           pick,
           quiet_output,
           setup_page,
           show_code,
           table,
           unreliable_reason,
           what_you_measured,
)

__all__ = ["Table", "finding", "finding_verdict", "on_gpu", "pick", "quiet_output", "setup_page", "show_code", "table",
           "unreliable_reason", "what_you_measured"]
