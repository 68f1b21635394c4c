-- config{} values are numbers, strings or booleans, what --set can give
local cfg = config{a = {b = 1}} -- ERROR
