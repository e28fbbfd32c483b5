import sys

try:
    from loopchat.cli.main import entry
except KeyboardInterrupt:  # Ctrl+C while Python still imports: the same line and exit code as later
    print("loopchat: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

if __name__ == "__main__":  # the engine's child process re-imports this module (spawn)
    entry()
