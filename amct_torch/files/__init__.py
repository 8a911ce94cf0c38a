"""File plumbing under every output: atomic writes, large files written around the page cache,
all outputs of a command committed together, termination signals turned into a clean exit,
protobuf wire encoding, the outputs' names and their errors.

Names are imported on first use (module ``__getattr__``), so that a module reads one of them
without importing the rest."""
from __future__ import annotations

from typing import TYPE_CHECKING

from amct_torch.runtime.lazy_names import lazy_names

#: name -> the module that defines it
_LAZY = {
    "atomic_write_text": "amct_torch.files.atomic",
    **{n: "amct_torch.files.output_names" for n in ("TEST_REPORT_SUFFIX", "output_path")},
    **{n: "amct_torch.files.transaction" for n in ("OutputTransaction", "check_output_name", "check_outputs",
                                                   "make_folder", "open_outputs", "user_path", "write_error")},
}

__all__ = ["TEST_REPORT_SUFFIX", "OutputTransaction", "atomic_write_text", "check_output_name", "check_outputs",
           "make_folder", "open_outputs", "output_path", "user_path", "write_error"]

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())

if TYPE_CHECKING:  # static analysers and IDEs see the real names
    from amct_torch.files.atomic import atomic_write_text
    from amct_torch.files.output_names import TEST_REPORT_SUFFIX, output_path
    from amct_torch.files.transaction import (
        OutputTransaction,
        check_output_name,
        check_outputs,
        make_folder,
        open_outputs,
        user_path,
        write_error,
    )
