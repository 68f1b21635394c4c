-- a preset's values too
local cfg = config({size = "tiny", L = 2}, -- ERROR
                   {size = {big = {L = {12}}}})
