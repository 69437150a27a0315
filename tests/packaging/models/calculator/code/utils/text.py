def normalise(text: str) -> str:
    return " ".join(text.lower().split())
