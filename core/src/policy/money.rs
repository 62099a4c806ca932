//! Money as exact integer minor units.
//!
//! Owns the one conversion from a JSON amount (`4180.00` with `"currency": "EUR"`) to the
//! integer Cedar compares (`418000`). The digits come from the number's RFC 8785 text — the
//! same digits the inputs hash covers — and are shifted as a decimal string, never multiplied
//! as a double, so `0.29` EUR is 29 cents and not 28.999….
//!
//! INVARIANT (fails closed): an amount finer than the currency's minor unit, an unknown
//! currency, or an amount that does not fit an `i64` is an error, never rounded.

use serde_json::Number;

use crate::canonical::{CanonicalError, number_text};

/// Why an amount has no exact minor-unit value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoneyError {
    /// The currency code is not one this build knows the minor unit of.
    #[error("unknown currency `{0}`")]
    UnknownCurrency(String),
    /// The amount has digits below the minor unit (e.g. `10.005` EUR).
    #[error("amount {0} is finer than the currency's minor unit")]
    SubMinor(String),
    /// The amount does not fit in 64 bits of minor units.
    #[error("amount {0} is out of range")]
    OutOfRange(String),
    /// The number has no canonical text.
    #[error(transparent)]
    Canonical(#[from] CanonicalError),
}

/// The ISO 4217 minor-unit exponent of `currency` (EUR → 2, JPY → 0), for the currencies
/// Countersign's examples and first deployments use.
pub fn minor_exponent(currency: &str) -> Option<u32> {
    match currency {
        "EUR" | "USD" | "GBP" | "CHF" | "SEK" | "NOK" | "DKK" | "PLN" | "CZK" | "CAD" | "AUD" => {
            Some(2)
        }
        "JPY" | "KRW" | "ISK" => Some(0),
        "BHD" | "KWD" | "JOD" | "TND" => Some(3),
        _ => None,
    }
}

/// `amount` in minor units of `currency`, exactly.
///
/// # Errors
/// See [`MoneyError`].
pub fn to_minor_units(amount: &Number, currency: &str) -> Result<i64, MoneyError> {
    let exponent =
        minor_exponent(currency).ok_or_else(|| MoneyError::UnknownCurrency(currency.into()))?;
    let text = number_text(amount)?;
    decimal_to_minor(&text, exponent)
}

/// Shifts ECMAScript number text (`-12.5`, `1e+21`, `5e-7`) by `exponent` decimal places.
fn decimal_to_minor(text: &str, exponent: u32) -> Result<i64, MoneyError> {
    let out_of_range = || MoneyError::OutOfRange(text.to_owned());
    let (negative, rest) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text),
    };
    let (mantissa_text, exp_text) = match rest.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e)),
        None => (rest, None),
    };
    let exp10: i64 = match exp_text {
        Some(e) => e
            .trim_start_matches('+')
            .parse()
            .map_err(|_| out_of_range())?,
        None => 0,
    };
    let (int_part, frac_part) = mantissa_text.split_once('.').unwrap_or((mantissa_text, ""));
    let mut mantissa: i128 = 0;
    for c in int_part.chars().chain(frac_part.chars()) {
        let d = c.to_digit(10).ok_or_else(out_of_range)?;
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(i128::from(d)))
            .ok_or_else(out_of_range)?;
    }
    let frac_len = i64::try_from(frac_part.len()).map_err(|_| out_of_range())?;
    // value = mantissa × 10^(exp10 − frac_len); minor = value × 10^exponent.
    let mut shift = exp10 - frac_len + i64::from(exponent);
    while shift > 0 {
        mantissa = mantissa.checked_mul(10).ok_or_else(out_of_range)?;
        shift -= 1;
    }
    while shift < 0 {
        if mantissa % 10 != 0 {
            return Err(MoneyError::SubMinor(text.to_owned()));
        }
        mantissa /= 10;
        shift += 1;
        if mantissa == 0 {
            break;
        }
    }
    let signed = if negative { -mantissa } else { mantissa };
    i64::try_from(signed).map_err(|_| out_of_range())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn minor(v: serde_json::Value, currency: &str) -> Result<i64, MoneyError> {
        match v {
            serde_json::Value::Number(n) => to_minor_units(&n, currency),
            _ => unreachable!(),
        }
    }

    #[test]
    fn exact_from_decimal_text() {
        assert_eq!(minor(json!(4180.00), "EUR"), Ok(418_000));
        assert_eq!(minor(json!(4180), "EUR"), Ok(418_000));
        assert_eq!(minor(json!(0.29), "EUR"), Ok(29));
        assert_eq!(minor(json!(1000.01), "EUR"), Ok(100_001));
        assert_eq!(minor(json!(25000.01), "EUR"), Ok(2_500_001));
        assert_eq!(minor(json!(-12.5), "EUR"), Ok(-1250));
        assert_eq!(
            minor(json!(1e21), "EUR"),
            Err(MoneyError::OutOfRange("1e+21".into()))
        );
        assert_eq!(minor(json!(1e15), "EUR"), Ok(100_000_000_000_000_000));
        assert_eq!(minor(json!(1500), "JPY"), Ok(1500));
        assert_eq!(minor(json!(0), "EUR"), Ok(0));
        // 0.29 * 100.0 as f64 is 28.999999999999996: the decimal path must not go through it.
        let naive = std::hint::black_box(0.29_f64) * 100.0;
        assert!(naive < 29.0);
    }

    #[test]
    fn refuses_what_it_cannot_represent() {
        assert_eq!(
            minor(json!(10.005), "EUR"),
            Err(MoneyError::SubMinor("10.005".into()))
        );
        assert_eq!(
            minor(json!(1.5), "JPY"),
            Err(MoneyError::SubMinor("1.5".into()))
        );
        assert_eq!(
            minor(json!(5e-7), "EUR"),
            Err(MoneyError::SubMinor("5e-7".into()))
        );
        assert_eq!(
            minor(json!(1), "XXX"),
            Err(MoneyError::UnknownCurrency("XXX".into()))
        );
        assert!(matches!(
            minor(json!(1e300), "EUR"),
            Err(MoneyError::OutOfRange(_))
        ));
    }
}
