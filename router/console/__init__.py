"""The operators' web console, served by the router on a listener of its own: the app (app.py: login,
frame, routing, assets), its admins and sessions (auth.py), the replies and a tenant's scope (http.py),
the live overview (events.py), a module per page (clients, sessions, retained, trace, bans) and the pages,
scripts and styles (assets/)."""
