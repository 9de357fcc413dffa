"""One module per command group of ``ragheat``; each imports its heavy dependencies inside the commands, so
``ragheat --help`` stays fast."""
