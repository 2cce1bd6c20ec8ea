"""PII masking of kept documents: e-mail addresses, IP addresses, phone numbers (an optional transform).

E-mail and IP patterns and replacement values follow datatrove's ``PIIFormatter`` (FineWeb's last step): realistic
stand-ins rather than placeholder tokens, so the model does not learn a ``<EMAIL>`` token, and only public IP
addresses by default (private, loopback and reserved ones are not personal).  The replacement is chosen from the
matched string's hash, not from a running counter, so the same input gives the same output on any shard split.
Phone numbers have no datatrove rule: ours accepts 10-15 digits (E.164 allows at most 15) in a phone layout
(groups separated by space, dot or hyphen, optional +country code and (area) code) or an 11-digit Chinese mobile
number, and never a date-like or dotted-quad string.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Callable

EMAIL = re.compile(
    r"\b[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@"
    r"(?:(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)")
IPV4 = re.compile(r"(?<![\d.])(?:(?:25[0-5]|2[0-4]\d|[01]?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|[01]?\d?\d)(?![\d.])")
PHONE = re.compile(
    r"(?<![\w.+/-])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?)?\d{2,4}(?:[ .-]\d{2,4}){1,4}(?![\w/]|[.-]\d)"
    r"|(?<!\d)1[3-9]\d{9}(?!\d)")
_DATE_LIKE = re.compile(r"^\(?\d{4}\)?[ .-]\d{1,2}[ .-]\d{1,2}$|^\d{1,2}[ .-]\d{1,2}[ .-]\d{4}$")

EMAIL_REPLACEMENTS = ("email@example.com", "firstname.lastname@example.org")
IP_REPLACEMENTS = ("22.214.171.124", "126.96.36.199", "188.8.131.52", "184.108.40.206", "220.127.116.11",
                   "18.104.22.168")
# 555-0100..0199 are reserved for fiction in the North American numbering plan.
PHONE_REPLACEMENTS = ("+1 555 0100", "+1 555 0142", "+1 555 0199")


def _pick(options: tuple[str, ...], matched: str) -> str:
    return options[hashlib.blake2b(matched.encode(), digest_size=4).digest()[0] % len(options)]


def _is_public_ip(s: str) -> bool:
    try:
        return ipaddress.ip_address(s).is_global
    except ValueError:
        return False


def _is_phone(s: str) -> bool:
    digits = sum(c.isdigit() for c in s)
    return 10 <= digits <= 15 and not _DATE_LIKE.match(s) and not IPV4.fullmatch(s)


class PiiMasker:
    """Masks the kinds switched on in a :class:`~pipeline.quality.filters.params.PiiConfig`; counts what it
    replaced."""

    def __init__(self, emails: bool = True, ips: bool = True, phones: bool = True, only_public_ips: bool = True):
        ip_ok: Callable[[str], bool] = _is_public_ip if only_public_ips else (lambda s: True)
        self._rules: list[tuple[str, re.Pattern, Callable[[str], bool], tuple[str, ...]]] = []
        if emails:
            self._rules.append(("email", EMAIL, lambda s: True, EMAIL_REPLACEMENTS))
        if ips:
            self._rules.append(("ip", IPV4, ip_ok, IP_REPLACEMENTS))
        if phones:
            self._rules.append(("phone", PHONE, _is_phone, PHONE_REPLACEMENTS))

    def mask(self, text: str) -> tuple[str, dict[str, int]]:
        counts: dict[str, int] = {}
        for kind, pattern, valid, options in self._rules:
            def repl(m: re.Match, kind=kind, valid=valid, options=options) -> str:
                s = m.group(0)
                if not valid(s) or s in options:
                    return s
                counts[kind] = counts.get(kind, 0) + 1
                return _pick(options, s)

            text = pattern.sub(repl, text)
        return text, counts
