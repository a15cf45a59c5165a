-- Takes the key over for the turn `ARGV[1]` (`{turn_id}:`) with the new value `ARGV[2]`
-- while it is free or still names that turn: how a replica that took a turn over (D3)
-- holds its agent on. Answers nil when adopted, else the value of the turn that holds it.
local v = redis.call('GET', KEYS[1])
if (not v) or string.sub(v, 1, string.len(ARGV[1])) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return false
end
return v
