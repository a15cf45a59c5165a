-- `RELEASE` that also settles the turn's quota counters, at each level it counts at (the
-- team's, keys 2-11, then its end user's, keys 12-21, L4): it leaves the running set and
-- its reservation (if not reaped already) is returned. Its billed tokens `ARGV[3]`,
-- billed at `ARGV[4]` (ms, Postgres' clock; empty: unknown, Redis' now), go into the
-- team's ledger of settled turns (keys 7 and 8) once per turn, and with it into each
-- level's ledger and each day and month counter that exists and was rebuilt from
-- billing events before they were billed (its `since`): a counter rebuilt later holds
-- them already. A retried settlement, or one of a turn whose reservation was reaped,
-- adds nothing twice and loses nothing. `ARGV[5]`: how long a ledger keeps a turn (ms).
-- `ARGV[6]` `1`: the turn never started (a retried message id's, answered by its earlier
-- turn: T12), so it leaves the minute's starts too. A level's keys: running,
-- reservations, their total, day, month, ledger (when, tokens), day's and month's
-- `since`, starts. 1 if the hold was ours.
local ours = redis.call('GET', KEYS[1]) == ARGV[1]
if ours then redis.call('DEL', KEYS[1]) end
local levels = (#KEYS - 1) / 10
for i = 1, levels do
  local k = 1 + (i - 1) * 10
  redis.call('ZREM', KEYS[k + 1], ARGV[2])
  if ARGV[6] == '1' then redis.call('ZREM', KEYS[k + 10], ARGV[2]) end
  local r = redis.call('HGET', KEYS[k + 2], ARGV[2])
  if r then
    redis.call('HDEL', KEYS[k + 2], ARGV[2])
    redis.call('DECRBY', KEYS[k + 3], r)
  end
end
local b = tonumber(ARGV[3])
if b > 0 then
  local at = tonumber(ARGV[4])
  if not at then
    local t = redis.call('TIME')
    at = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  if redis.call('ZADD', KEYS[7], 'NX', at, ARGV[2]) == 1 then
    local keep = tonumber(ARGV[5])
    for i = 1, levels do
      local k = 1 + (i - 1) * 10
      if i > 1 then redis.call('ZADD', KEYS[k + 6], at, ARGV[2]) end
      redis.call('HSET', KEYS[k + 7], ARGV[2], b)
      for j = 4, 5 do
        if redis.call('EXISTS', KEYS[k + j]) == 1
          and at >= tonumber(redis.call('GET', KEYS[k + j + 4]) or '0') then
          redis.call('INCRBY', KEYS[k + j], b)
        end
      end
      local old = redis.call('ZRANGEBYSCORE', KEYS[k + 6], '-inf', at - keep)
      if #old > 0 then
        redis.call('HDEL', KEYS[k + 7], unpack(old))
        redis.call('ZREMRANGEBYSCORE', KEYS[k + 6], '-inf', at - keep)
      end
      redis.call('PEXPIRE', KEYS[k + 6], keep)
      redis.call('PEXPIRE', KEYS[k + 7], keep)
    end
  end
end
if ours then return 1 end
return 0
