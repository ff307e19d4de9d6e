"""The pages' forms: raising a flagged session's caps (/flagged/ and the session page's
banner), and what the form suggests. Each error names its field and what to write instead."""

from __future__ import annotations

from decimal import ROUND_CEILING, Decimal
from typing import Any

from django import forms

from costboard.budgets.caps import Caps
from costboard.dashboards.selectors.flagged import session_cap_reasons, session_cap_uses
from costboard.input_limits import amount_fault
from costboard.models import Session

MAX_TOKEN_CAP = 2**63 - 1  # a bigint


def _digits_checked(name: str, example: str, value: Any) -> None:
    """A cap typed in the digits 0-9 alone: int() and Decimal() read "１２" as 12 and "1_000"
    as 1000."""
    fault = amount_fault(value, example=example) if isinstance(value, str) else None
    if fault is not None:
        raise forms.ValidationError(f"{name}: {fault}.", code="invalid")


class TokenCapField(forms.IntegerField):
    def clean(self, value: Any) -> Any:
        _digits_checked("Token cap", "200000", value)
        return super().clean(value)


class UsdCapField(forms.DecimalField):
    def clean(self, value: Any) -> Any:
        _digits_checked("USD cap", "10.00", value)
        return super().clean(value)


class RaiseCapForm(forms.Form):
    """New caps for one session: each optional (blank keeps it), each above the current one."""

    token_cap = TokenCapField(
        required=False,
        min_value=1,
        max_value=MAX_TOKEN_CAP,
        error_messages={
            "invalid": "Token cap: enter a whole number of tokens, e.g. 200000.",
            "min_value": "Token cap: must be a positive whole number of tokens.",
            "max_value": "Token cap: too large.",
        },
    )
    cost_cap_usd = UsdCapField(
        required=False,
        max_digits=14,
        decimal_places=4,
        error_messages={
            "invalid": "USD cap: enter an amount in dollars, e.g. 10.00.",
            "max_decimal_places": "USD cap: at most 4 decimal places.",
            "max_digits": "USD cap: too large.",
            "max_whole_digits": "USD cap: too large.",
        },
    )

    def __init__(self, *args: Any, caps: Caps, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.caps = caps
        if self.is_bound:  # "200,000" and "$10" mean what they say
            data = {key: self.data.get(key) for key in self.data}
            for name, junk in (("token_cap", ",_ "), ("cost_cap_usd", ",_ $")):
                value = str(data.get(name) or "")
                data[name] = value.translate(str.maketrans("", "", junk))
            self.data = data

    def clean_token_cap(self) -> int | None:
        value: int | None = self.cleaned_data["token_cap"]
        if value is not None and value <= self.caps.token_cap:
            raise forms.ValidationError(
                f"Token cap: must be higher than the current cap of {self.caps.token_cap:,} "
                "(this raises it; lower caps in the admin)."
            )
        return value

    def clean_cost_cap_usd(self) -> Decimal | None:
        value: Decimal | None = self.cleaned_data["cost_cap_usd"]
        if value is None:
            return None
        if value <= 0:
            raise forms.ValidationError("USD cap: must be more than $0.")
        if value <= self.caps.cost_cap_usd:
            raise forms.ValidationError(
                f"USD cap: must be higher than the current cap of ${self.caps.cost_cap_usd:,.2f} "
                "(this raises it; lower caps in the admin)."
            )
        return value

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        fields_ok = not self.errors
        if fields_ok and cleaned.get("token_cap") is None and cleaned.get("cost_cap_usd") is None:
            raise forms.ValidationError("Give a new token cap, a new USD cap, or both.")
        return cleaned


def _round_up(value: Decimal) -> Decimal:
    """Up to two significant digits: 182,400 → 190,000; 10.04 → 11."""
    if value <= 0:
        return value
    step = Decimal(1).scaleb(value.adjusted() - 1)
    return (value / step).to_integral_value(rounding=ROUND_CEILING) * step


def suggested_caps(session: Session, caps: Caps) -> dict[str, object]:
    """The raise form's prefill: for each cap behind the flag (both when it is a runaway's),
    double the cap, or double the use when that is more, rounded up; the other left blank."""
    behind = session_cap_reasons(session, caps) or session_cap_uses(session, caps)
    names = {use.name for use in behind}
    initial: dict[str, object] = {}
    if "tokens" in names:
        tokens = max(2 * caps.token_cap, 2 * session.tokens_used, 1)
        initial["token_cap"] = int(_round_up(Decimal(tokens)))
    if "USD" in names:
        dollars = max(2 * caps.cost_cap_usd, 2 * session.cost_usd, Decimal("0.01"))
        initial["cost_cap_usd"] = _round_up(dollars).quantize(
            Decimal("0.01"), rounding=ROUND_CEILING
        )
    return initial
