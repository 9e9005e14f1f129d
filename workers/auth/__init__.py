"""Who may connect and what they may touch, decided in each worker: the logins and each connection's
ACL checker (logins.py: `Auth`, per tenant `TenantAuth`), from the password file (passwords.py), the
ACL file (acl.py), a MySQL/MariaDB database (database.py) or JWT bearer tokens (tokens.py), and the
server side of MQTT 5.0 SCRAM-SHA-256 (scram.py). Empty here, so that a module that needs one of them
(the router's console reads the password file format) imports only that one."""
