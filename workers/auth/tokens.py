"""OAuth2/JWT bearer tokens in the CONNECT password field, verified offline against a JWKS file.

Why offline: the worker must never wait on a network call to log a client in; the public keys
(RS256 or ES256) are read from a file the operator keeps current (re-read on SIGHUP), and the
signature, expiry, audience and issuer are checked locally with PyJWT.
"""

from __future__ import annotations

import json

ALGORITHMS = ["RS256", "ES256"]


class TokenError(ValueError):
    """One line naming the JWKS file and what is wrong with it."""


class TokenVerifier:
    def __init__(self, path: str, audience: str, issuer: str, username_claim: str = "sub", tenant_claim: str = "") -> None:
        import jwt  # here, not at the top: PyJWT costs every worker's start ~30 ms where no token is read

        try:
            with open(path, "rb") as f:
                keys = jwt.PyJWKSet.from_dict(json.loads(f.read()))
        except OSError as exc:
            raise TokenError(f"{path}: {exc.strerror}") from None
        except (ValueError, jwt.exceptions.PyJWKSetError) as exc:
            raise TokenError(f"{path}: not a usable JWKS file: {exc}") from None
        self.keys = {key.key_id: key for key in keys.keys}
        self.audience = audience or None
        self.issuer = issuer or None
        self.username_claim = username_claim
        self.tenant_claim = tenant_claim  # jwt_tenant_claim: "" none

    @staticmethod
    def looks_like_token(password: bytes | None) -> bool:
        return password is not None and password.count(b".") == 2

    def verify(self, token: bytes) -> tuple[str, float, str] | None:
        """(the user name the token names in its `username_claim`, its expiry, the tenant its
        `tenant_claim` names or "") when its signature, expiry, audience and issuer hold and it names a
        user; else None. A token must name its user: one without the claim would log in as whatever
        user name the client chose. A tenant claim that is there must be a name."""
        import jwt

        try:
            kid = jwt.get_unverified_header(token).get("kid")
            key = self.keys.get(kid) if kid is not None else next(iter(self.keys.values()), None)
            if key is None or key.algorithm_name not in ALGORITHMS:
                return None
            # only the key's own algorithm: a token whose `alg` does not fit its key is a bad token
            claims = jwt.decode(token, key.key, algorithms=[key.algorithm_name], audience=self.audience,
                                issuer=self.issuer, options={"require": ["exp"], "verify_aud": self.audience is not None})
        except jwt.exceptions.PyJWTError:
            return None
        name = claims.get(self.username_claim)
        tenant = claims.get(self.tenant_claim, "") if self.tenant_claim else ""
        if not isinstance(name, str) or not name or not isinstance(tenant, str):
            return None
        return name, float(claims["exp"]), tenant
