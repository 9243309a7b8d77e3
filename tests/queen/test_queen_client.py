"""Queen's Python client (queen-mq 2.6.0), unchanged, against a stile gateway.

Run by tests/tests/queen_client.rs, which starts the gateway on a fresh
database and passes its URL as the one argument. Exits non-zero on the first
failed check, printing it.
"""

import asyncio
import sys
import uuid

from queen import Queen


async def main(url: str) -> None:
    run = uuid.uuid4().hex[:8]
    async with Queen(url) as client:
        # kv.once: the first caller wins, every later one loses.
        key = f"welcome-{run}"
        assert await client.kv.once("steps", key, ttl_seconds=600) is True, "the first once wins"
        assert await client.kv.once("steps", key, ttl_seconds=600) is False, "a second once loses"

        # The KV surface: put, get, incr with a bound, delete.
        put = await client.kv.put("cfg", f"k-{run}", {"level": 3}, forever=True)
        assert put, put
        got = await client.kv.get("cfg", f"k-{run}")
        assert got["found"] and got["value"] == {"level": 3} and got["version"] == put["version"], got
        first = await client.kv.incr("limits", f"c-{run}", delta=2, max=3, ttl_seconds=60)
        assert first and first["value"] == 2, first
        refused = await client.kv.incr("limits", f"c-{run}", delta=2, max=3, ttl_seconds=60)
        assert not refused and refused["reason"] == "limit", refused
        assert await client.kv.delete("cfg", f"k-{run}"), "delete of a key that exists applies"
        assert not await client.kv.get("cfg", f"k-{run}"), "a deleted key is not found"

        # A transaction with once and a push: commits once, then the gate holds.
        gate = f"mail-{run}"
        tx = (
            client.transaction()
            .once("mailer", gate, ttl_seconds=600)
            .queue("emails").partition("u1").push([{"transactionId": f"m1-{run}", "data": {"to": "a@b"}}])
        )
        committed = await tx.commit()
        assert committed and committed["success"] is True, committed
        pushes = [r for r in committed["results"] if r.get("type") == "push"]
        assert len(pushes) == 1 and pushes[0]["transactionId"] == f"m1-{run}", committed
        # A redelivery with a fresh push id: the gate refuses it, returned (not raised).
        again = (
            client.transaction()
            .once("mailer", gate, ttl_seconds=600)
            .queue("emails").partition("u1").push([{"transactionId": f"m2-{run}", "data": {"to": "a@b"}}])
        )
        lost = await again.commit()
        assert not lost and lost["reason"] == "kv_precondition", lost

        # A plain push of the transaction's id answers duplicate with the original.
        retry = await client.queue("emails").partition("u1").push([{"transactionId": f"m1-{run}", "data": {"to": "a@b"}}])
        assert retry[0]["status"] == "duplicate", retry
        assert retry[0]["message_id"] == pushes[0]["messageId"], (retry, pushes)

        # Timers: schedule in the past (fires on the first sweep), peek, list, cancel.
        due = await client.timers.schedule("reminders", f"due-{run}", {"n": 1}, delay_ms=-1000, txn=f"t-due-{run}")
        assert due and due["status"] == "scheduled" and due["txn"] == f"t-due-{run}", due
        later = await client.timers.schedule("reminders", f"later-{run}", {"n": 2}, delay_ms=3_600_000)
        assert later and later["messageId"], later
        peek = await client.timers.peek("reminders", f"later-{run}")
        assert peek and peek["txn"] == later["txn"], peek
        listed = await client.timers.list("reminders")
        assert any(r["timerKey"] == f"later-{run}" for r in listed["rows"]), listed
        cancelled = await client.timers.cancel("reminders", f"later-{run}")
        assert cancelled and cancelled["status"] == "cancelled", cancelled
        absent = await client.timers.cancel("reminders", f"later-{run}", txn=later["txn"])
        assert not absent and absent["status"] == "absent" and absent["txn"] == later["txn"], absent

        # The due timer's message arrives with the txn as its transactionId.
        for _ in range(200):
            if not await client.timers.peek("reminders", f"due-{run}"):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the due timer never fired")
        fired = await client.queue("reminders").push([{"transactionId": f"t-due-{run}", "data": {"n": 1}}])
        assert fired[0]["status"] == "duplicate" and fired[0]["message_id"] == due["messageId"], (fired, due)

        # A timer riding a transaction.
        ride = (
            client.transaction()
            .queue("orders").push([{"transactionId": f"o-{run}", "data": {"id": 1}}])
            .timer("reminders").key(f"ride-{run}").payload({"id": 1}).after_ms(3_600_000).schedule()
        )
        rode = await ride.commit()
        assert rode["success"] and any(r.get("type") == "timer" and r["status"] == "scheduled" for r in rode["results"]), rode

    print("queen-mq client: every check passed")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
