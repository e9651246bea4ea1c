"""The command line's exit codes.

2: the command line, a config or params file, or a named input that cannot be opened;
1: anything that went wrong while running; 141: stdout closed early (as `cat` under `head`)."""

EXIT_OK, EXIT_FAILED, EXIT_BAD_CONFIG, EXIT_PIPE_CLOSED = 0, 1, 2, 141
