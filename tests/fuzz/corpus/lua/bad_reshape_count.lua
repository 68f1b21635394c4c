-- reshape to a different element count
local x = input("x", {4, 8})
local y = x:reshape{5, 7} -- ERROR
minimize(y:sum())
