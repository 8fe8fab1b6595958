"""What every floor may use: the one user-error class, field checks, file paths (local or gs://).

Imports nothing else of the package.
"""
