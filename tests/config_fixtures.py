"""Helpers for tests that compare configs field by field."""


def flat(config) -> dict:
    """A config as {"section.field": value} (nested sections joined with dots)."""
    out = {}

    def walk(prefix, value):
        if hasattr(value, "items"):
            for key, inner in value.items():
                walk(f"{prefix}{key}.", inner)
        else:
            out[prefix[:-1]] = value

    walk("", config.to_dict())
    return out
