"""What operators watch and ask of the router, beside the routing: the broker's numbers as `$SYS` and
Prometheus series (stats.py), the alarms drawn from them (alarms.py), the overview's history of them
(history.py), the audit log of the admins' actions (audit.py), the HTTP endpoint of `/metrics`,
`/health` and the admin actions (metrics.py) behind the admin credential (admin.py), and the bounded
HTTP server it and the web console run on (httpd.py)."""
