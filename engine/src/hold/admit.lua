-- The quota-aware `ACQUIRE` (see the module doc for the keys). Keys: the hold, then the
-- team's level (limits, running, reservations, their total, starts, day, month), then,
-- for an end user's turn (L4), the user's level (its overrides, then the same six).
-- Answers `{"busy", value}`, `{"limits"}` (none stored: the next call carries them,
-- `ARGV[5]` = `1`, `ARGV[7..10]` the team's, `ARGV[12..15]` its `per_user`, `ARGV[16]`
-- `1` when any user has overrides, `ARGV[17..20]` this user's overrides, `-` for none),
-- `{"rebuild", level}` (a budget counter of `team` or `user` is missing: `REBUILD` it,
-- then call again), `{"refused", level, field, standings…}`, `{"ok"}` (no level has a
-- turn limit) or `{"ok", standings…}`: per level counted (the team's, then the user's
-- when it has a turn limit of its own) the running turns, the turns of the last minute,
-- ms until the oldest of them leaves the window, billed + reserved tokens of the day and
-- month, as the turn leaves them, then the four turn limits (empty for unlimited). A
-- user's limit is its override if it has one, else the team's `per_user`. The refusal
-- rule is `quota::fallback::decide_levels`', in the same order.
local cur = redis.call('GET', KEYS[1])
if cur then return {'busy', cur} end
local user = #KEYS > 8
if ARGV[5] == '1' then
  redis.call('HSET', KEYS[2], 'set', '1', 'tpd', ARGV[7], 'tpmo', ARGV[8], 'tpm', ARGV[9], 'ct', ARGV[10],
    'utpd', ARGV[12], 'utpmo', ARGV[13], 'utpm', ARGV[14], 'uct', ARGV[15], 'uo', ARGV[16])
  redis.call('PEXPIRE', KEYS[2], ARGV[6])
  if user then
    redis.call('HSET', KEYS[9], 'set', '1', 'tpd', ARGV[17], 'tpmo', ARGV[18], 'tpm', ARGV[19], 'ct', ARGV[20])
    redis.call('PEXPIRE', KEYS[9], ARGV[6])
  end
end
local lim = redis.call('HMGET', KEYS[2], 'set', 'tpd', 'tpmo', 'tpm', 'ct', 'utpd', 'utpmo', 'utpm', 'uct', 'uo')
if not lim[1] then return {'limits'} end
local function num(v) if not v or v == '' then return nil end return tonumber(v) end
local function limited(l) return num(l[1]) or num(l[2]) or num(l[3]) or num(l[4]) end
local levels = {{base = 3, scope = 'team', lim = {lim[2] or '', lim[3] or '', lim[4] or '', lim[5] or ''}}}
if user then
  local def = {lim[6] or '', lim[7] or '', lim[8] or '', lim[9] or ''}
  if lim[10] == '1' or limited(def) then
    local o = redis.call('HMGET', KEYS[9], 'set', 'tpd', 'tpmo', 'tpm', 'ct')
    if not o[1] then return {'limits'} end
    local u = {}
    for i = 1, 4 do
      if o[i + 1] and o[i + 1] ~= '-' then u[i] = o[i + 1] else u[i] = def[i] end
    end
    if limited(u) then levels[2] = {base = 10, scope = 'user', lim = u} end
  end
end
if not (limited(levels[1].lim) or levels[2]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {'ok'}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _, lv in ipairs(levels) do
  local k = lv.base
  local gone = redis.call('ZRANGEBYSCORE', KEYS[k], '-inf', now)
  for _, m in ipairs(gone) do
    local r = redis.call('HGET', KEYS[k + 1], m)
    if r then
      redis.call('DECRBY', KEYS[k + 2], r)
      redis.call('HDEL', KEYS[k + 1], m)
    end
  end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[k], '-inf', now) end
  lv.running = redis.call('ZCARD', KEYS[k])
  redis.call('ZREMRANGEBYSCORE', KEYS[k + 3], '-inf', now - 60000)
  lv.recent = redis.call('ZCARD', KEYS[k + 3])
  lv.reset = 0
  if lv.recent > 0 then
    local oldest = redis.call('ZRANGE', KEYS[k + 3], 0, 0, 'WITHSCORES')
    lv.reset = tonumber(oldest[2]) + 60000 - now
  end
  lv.day, lv.month = 0, 0
  local tpd, tpmo = num(lv.lim[1]), num(lv.lim[2])
  if tpd or tpmo then
    local d, m = redis.call('GET', KEYS[k + 4]), redis.call('GET', KEYS[k + 5])
    if (tpd and not d) or (tpmo and not m) then return {'rebuild', lv.scope} end
    local resv = tonumber(redis.call('GET', KEYS[k + 2]) or '0')
    lv.day = tonumber(d or '0') + resv
    lv.month = tonumber(m or '0') + resv
  end
end
local function answer(head, scope, field)
  local a = {head}
  if scope then a[#a + 1] = scope; a[#a + 1] = field end
  for _, lv in ipairs(levels) do
    for _, v in ipairs({lv.running, lv.recent, lv.reset, lv.day, lv.month}) do
      a[#a + 1] = string.format('%.0f', v)
    end
    for i = 1, 4 do a[#a + 1] = lv.lim[i] end
  end
  return a
end
for _, lv in ipairs(levels) do
  local tpd, tpmo, tpm, ct = num(lv.lim[1]), num(lv.lim[2]), num(lv.lim[3]), num(lv.lim[4])
  if ct and lv.running >= ct then return answer('refused', lv.scope, 'concurrent_turns') end
  if tpm and lv.recent >= tpm then return answer('refused', lv.scope, 'turns_per_minute') end
  if tpd and lv.day >= tpd then return answer('refused', lv.scope, 'tokens_per_day') end
  if tpmo and lv.month >= tpmo then return answer('refused', lv.scope, 'tokens_per_month') end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local r = tonumber(ARGV[4])
for _, lv in ipairs(levels) do
  local k = lv.base
  redis.call('ZADD', KEYS[k], now + tonumber(ARGV[2]), ARGV[3])
  redis.call('HSET', KEYS[k + 1], ARGV[3], r)
  redis.call('INCRBY', KEYS[k + 2], r)
  redis.call('ZADD', KEYS[k + 3], now, ARGV[3])
  for i = k, k + 2 do redis.call('PEXPIRE', KEYS[i], ARGV[11]) end
  redis.call('PEXPIRE', KEYS[k + 3], 61000)
  lv.running, lv.recent, lv.day, lv.month = lv.running + 1, lv.recent + 1, lv.day + r, lv.month + r
  if lv.reset == 0 then lv.reset = 60000 end
end
return answer('ok')
