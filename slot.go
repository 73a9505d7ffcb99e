package admit

// keySlot returns the Valkey Cluster hash slot of key: CRC16 (XMODEM) modulo
// 16384, hashing only the hash tag when the key has one. A hash tag is the
// part between the first "{" and the first "}" after it, when non-empty.
// valkey-go exports no slot function, and its cluster client panics while
// building a command whose keys are in different slots, so the slots are
// checked here first.
func keySlot(key string) uint16 {
	for i := 0; i < len(key); i++ {
		if key[i] == '{' {
			for j := i + 1; j < len(key); j++ {
				if key[j] == '}' {
					if j > i+1 {
						key = key[i+1 : j]
					}
					return crc16(key) & 16383
				}
			}
			break
		}
	}
	return crc16(key) & 16383
}

func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^s[i]]
	}
	return crc
}

// crc16Table is CRC16-CCITT (XMODEM), polynomial 0x1021, as the cluster
// specification prescribes.
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
