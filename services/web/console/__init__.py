"""The operator's console (docs/console.md): server-rendered pages behind a session cookie,
and its actions. ``routes.py`` holds the pages, ``actions.py`` the changes and streams; the
HTML is in ``templates/``, ``console.js`` and ``console.css`` in ``static/``."""
