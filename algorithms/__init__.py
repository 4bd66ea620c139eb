"""The built-in paper families, one plugin package each (entry points `raysim.plugins`).

The runtime never imports them by name: `raysim.plugins.load_builtin` does, on the first lookup.
"""
