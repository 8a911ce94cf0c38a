"""The ``amct-torch`` subcommands, one module each: ``add_parser(sub)`` adds its parser (its
arguments, help and examples) and ``run(args)`` runs it and returns the exit code;
``amct_torch.cli`` builds the command from them. Arguments that several commands take are
declared once (``shared.py``, the job options' own declarations in ``workflow/options.py``).
Torch-free at import: ``--help`` and argument errors load no heavy package.
"""
