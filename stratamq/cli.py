def main() -> None:  # replaced below
    raise SystemExit("cli not ready")
