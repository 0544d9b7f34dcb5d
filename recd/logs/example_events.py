"""An example shop clickstream CSV, to try ``recd logs ingest`` and the ``own_data`` pipeline.

    recd init own_data myproj --example-events          # myproj/events.csv, 20,000 events
    python -m recd.logs.example_events                  # ./events.csv
    python -m recd.logs.example_events --events 200000 --out /tmp/events.csv

The columns follow a public e-commerce behaviour log (one event per line, sessions
interleaved, in time order)::

    event_time     ISO 8601, UTC ("2026-11-01T08:00:03Z"), over --hours hours
    event_type     view, cart, purchase, or search (a search has no product)
    product_id     integer; empty on search events
    category_id    integer; empty on search events
    brand_id       integer; empty on search events
    price          float; empty on search events
    user_id        integer
    user_session   a string id, one per visit

Carts and purchases depend on the product (popular, cheap products sell more) and on what the
session viewed before, so a model has something to learn. The same --seed writes the same file.
"""

from __future__ import annotations

import argparse
import csv
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from recd.errors import ConfigError

START = datetime(2026, 11, 1, 8, 0, 0, tzinfo=UTC)
PRODUCTS = 3000
CATEGORIES = 120
BRANDS = 80
MEAN_EVENTS_PER_SESSION = 10.0
MEAN_GAP_S = 25.0
SEARCH_RATE = 0.12
DEFAULT_EVENTS = 20_000
DEFAULT_OUT = "events.csv"  # the own_data pipeline's [ingest] input


def make_events(events: int, *, hours: float = 4.0, seed: int = 0) -> list[list[str]]:
    """About ``events`` rows (header first) of an interleaved shop clickstream, in time order."""
    rng = np.random.default_rng(seed)
    popularity = 1.0 / np.arange(1, PRODUCTS + 1) ** 1.1
    popularity /= popularity.sum()
    category = rng.integers(1, CATEGORIES + 1, size=PRODUCTS)
    brand = rng.integers(1, BRANDS + 1, size=PRODUCTS)
    price = np.round(np.exp(rng.normal(3.5, 0.8, size=PRODUCTS)), 2)
    appeal = rng.normal(0.0, 1.0, size=PRODUCTS) - 0.6 * np.log(price / 30.0)
    rows: list[tuple[int, list[str]]] = []
    session = 0
    while len(rows) < events:
        session += 1
        user = int(rng.integers(1, max(2, events // 15)))
        name = f"s{seed:02d}-{session:06d}-{int(rng.integers(16**6)):06x}"
        t = rng.uniform(0.0, hours * 3600.0 - 600.0)
        viewed: list[int] = []
        for _ in range(1 + rng.geometric(1.0 / MEAN_EVENTS_PER_SESSION)):
            t += rng.exponential(MEAN_GAP_S)
            if t >= hours * 3600.0:
                break  # the log ends
            if rng.random() < SEARCH_RATE:
                rows.append(
                    (int(t * 1000), _row(t, "search", None, user, name, category, brand, price))
                )
                continue
            if viewed and rng.random() < 0.35:
                product = viewed[int(rng.integers(len(viewed)))]  # back to a product seen before
            else:
                product = int(rng.choice(PRODUCTS, p=popularity))
            seen = viewed.count(product)
            viewed.append(product)
            p_cart = 1.0 / (1.0 + np.exp(-(appeal[product] - 2.6 + 0.9 * seen)))
            kind = "view"
            if rng.random() < p_cart:
                kind = "purchase" if seen and rng.random() < 0.4 else "cart"
            rows.append((int(t * 1000), _row(t, kind, product, user, name, category, brand, price)))
    rows.sort(key=lambda r: r[0])
    header = [
        "event_time",
        "event_type",
        "product_id",
        "category_id",
        "brand_id",
        "price",
        "user_id",
        "user_session",
    ]
    return [header, *(row for _, row in rows[:events])]


def _row(
    t: float,
    kind: str,
    product: int | None,
    user: int,
    session: str,
    category: np.ndarray,
    brand: np.ndarray,
    price: np.ndarray,
) -> list[str]:
    when = datetime.fromtimestamp(START.timestamp() + t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if product is None:
        return [when, kind, "", "", "", "", str(user), session]
    return [
        when,
        kind,
        str(product + 1000),
        str(int(category[product])),
        str(int(brand[product])),
        f"{price[product]:.2f}",
        str(user),
        session,
    ]


def write_example_events(
    path: Path, events: int = DEFAULT_EVENTS, *, hours: float = 4.0, seed: int = 0
) -> int:
    """Write :func:`make_events` to ``path`` (parents created); returns the events written."""
    if events < 1:
        raise ConfigError(f"--events: expected an integer >= 1, got {events}")
    if not hours > 600 / 3600:
        raise ConfigError(f"--hours: expected more than 10 minutes, got {hours}")
    rows = make_events(events, hours=hours, seed=seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)
    return len(rows) - 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m recd.logs.example_events",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), help="CSV file to write")
    parser.add_argument("--events", type=int, default=DEFAULT_EVENTS, help="rows to write")
    parser.add_argument("--hours", type=float, default=4.0, help="time span in hours")
    parser.add_argument("--seed", type=int, default=0, help="the same seed writes the same file")
    args = parser.parse_args(argv)
    try:
        written = write_example_events(args.out, args.events, hours=args.hours, seed=args.seed)
    except ConfigError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {written:,} events to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
