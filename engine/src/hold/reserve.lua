-- A further model call of an admitted turn (`ARGV[1]`) reserves its estimate (`ARGV[2]`)
-- at each level it counts at (the team's, then its end user's): four keys a level (the
-- reservations, their total, the day's and the month's counters) and two limits
-- (`ARGV[3]`/`ARGV[4]` the team's day and month budgets, `ARGV[5]`/`ARGV[6]` the
-- user's; empty for none). Answers `{"rebuild", level}` (as `ADMIT`'s),
-- `{"refused", level, field, day, month}` or `{"ok"}`. A turn that is not running in a
-- level's counters (its entry lapsed) reserves nothing there and is let through: it was
-- admitted.
local function num(v) if not v or v == '' then return nil end return tonumber(v) end
local function f(v) return string.format('%.0f', v) end
local scopes = {'team', 'user'}
for i = 1, #KEYS / 4 do
  local k = (i - 1) * 4
  local tpd, tpmo = num(ARGV[1 + 2 * i]), num(ARGV[2 + 2 * i])
  local d, m = redis.call('GET', KEYS[k + 3]), redis.call('GET', KEYS[k + 4])
  if (tpd and not d) or (tpmo and not m) then return {'rebuild', scopes[i]} end
  local resv = tonumber(redis.call('GET', KEYS[k + 2]) or '0')
  local day, month = tonumber(d or '0') + resv, tonumber(m or '0') + resv
  if tpd and day >= tpd then return {'refused', scopes[i], 'tokens_per_day', f(day), f(month)} end
  if tpmo and month >= tpmo then return {'refused', scopes[i], 'tokens_per_month', f(day), f(month)} end
end
local r = tonumber(ARGV[2])
for i = 1, #KEYS / 4 do
  local k = (i - 1) * 4
  if redis.call('HEXISTS', KEYS[k + 1], ARGV[1]) == 1 then
    redis.call('HINCRBY', KEYS[k + 1], ARGV[1], r)
    redis.call('INCRBY', KEYS[k + 2], r)
  end
end
return {'ok'}
