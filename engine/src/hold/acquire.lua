-- Sets the key if free and answers nil; otherwise answers the current value. One round
-- trip, atomic: a refused caller learns the running turn at once.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return false
end
return redis.call('GET', KEYS[1])
