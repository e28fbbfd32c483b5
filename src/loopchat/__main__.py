from loopchat.cli.main import main

if __name__ == "__main__":  # the engine's child process re-imports this module (spawn)
    raise SystemExit(main())
