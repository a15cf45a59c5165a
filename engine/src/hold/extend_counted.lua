-- `EXTEND` that also pushes the turn's running entries back (the team's, and its end
-- user's when it has one), so a live turn stays counted.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  for i = 2, #KEYS do
    redis.call('ZADD', KEYS[i], 'XX', now + tonumber(ARGV[2]), ARGV[3])
  end
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
